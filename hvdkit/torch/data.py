"""Sharding datasets by rank."""

import math

import torch
from torch.utils.data import DataLoader, DistributedSampler, Sampler

from .runtime import rank, size

__all__ = ["train_sampler", "EvalSampler", "train_loader", "eval_loader"]


def train_sampler(dataset, shuffle=True, seed=0, drop_last=False):
    """torch's DistributedSampler fed with hvdkit's rank and size.

    Every rank gets ceil(n / size) samples per epoch (a few samples repeat when n does not divide,
    unless ``drop_last``). Call ``sampler.set_epoch(epoch)`` at the start of each epoch, so the
    shuffle changes every epoch and is the same on every rank.
    """
    return DistributedSampler(dataset, num_replicas=size(), rank=rank(), shuffle=shuffle, seed=seed, drop_last=drop_last)


class EvalSampler(Sampler):
    """Every sample exactly once over all ranks, no padding: rank r gets indices r, r+size, ...

    Shards differ by at most one sample; average metrics with sample counts (``MetricTracker``)
    so the result equals the metric over the whole dataset.
    """

    def __init__(self, dataset, num_replicas=None, rank_=None):
        self.n = len(dataset)
        self.size = size() if num_replicas is None else num_replicas
        self.rank = rank() if rank_ is None else rank_

    def __iter__(self):
        return iter(range(self.rank, self.n, self.size))

    def __len__(self):
        return max(0, math.ceil((self.n - self.rank) / self.size))

    def set_epoch(self, epoch):
        """Evaluation order does not change with the epoch (kept for a uniform loop)."""


def train_loader(dataset, batch_size, shuffle=True, seed=0, drop_last=False, **kwargs):
    """A DataLoader over this rank's training shard (see ``train_sampler``)."""
    sampler = train_sampler(dataset, shuffle=shuffle, seed=seed, drop_last=drop_last)
    generator = torch.Generator().manual_seed(seed)
    return DataLoader(dataset, batch_size=batch_size, sampler=sampler, generator=generator, **kwargs)


def eval_loader(dataset, batch_size, **kwargs):
    """A DataLoader over this rank's evaluation shard (see ``EvalSampler``)."""
    return DataLoader(dataset, batch_size=batch_size, sampler=EvalSampler(dataset), **kwargs)
