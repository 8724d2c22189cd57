"""Sharding datasets by rank: training batches by a global sample offset, evaluation shards."""

from __future__ import annotations

import math
from collections.abc import Iterator, Sized
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler, Sampler

from ..core.data import BatchPlan, epoch_order, plan_batches, position_after, rank_batches, step_bounds
from ..core.deprecation import renamed_argument
from ..core.log import get_logger
from . import runtime

__all__ = ["train_sampler", "TrainSampler", "TrainLoader", "EvalSampler", "train_loader", "eval_loader"]

_log = get_logger("data")


def train_sampler(dataset: Dataset, shuffle: bool = True, seed: int = 0, drop_last: bool = False) -> DistributedSampler:
    """torch's DistributedSampler fed with hvdkit's rank and size (for a DataLoader you build yourself).

    Every rank gets ceil(n / size) samples per epoch (a few samples repeat when n does not divide,
    unless ``drop_last``). Call ``sampler.set_epoch(epoch)`` at the start of each epoch, so the
    shuffle changes every epoch and is the same on every rank. It cannot resume mid-epoch at
    another world size; ``train_loader`` (``TrainSampler``) can.
    """
    return DistributedSampler(
        dataset, num_replicas=runtime.size(), rank=runtime.rank(), shuffle=shuffle, seed=seed, drop_last=drop_last
    )


class TrainSampler(Sampler):
    """A batch sampler: this rank's micro-batches of an epoch, laid out by global sample offset.

    Epoch ``e`` visits all ``n`` samples in an order drawn from ``(seed, e)``; each optimizer step
    takes the next ``global_batch_size`` positions of it and splits them over ``size`` ranks x
    ``accumulation`` micro-batches (the rule of ``hvdkit.core.data``). ``plan`` is the
    ``hvdkit.core.data.BatchPlan``: with ``global_batch_size`` given, the accumulation is
    chosen so the global batch is the same at any world size. Every sample is used exactly once
    per epoch (the last step may be smaller, or a little larger when a short remainder is merged
    into it; ``drop_last`` skips the last ``n % global_batch_size`` instead), and every rank yields
    the same number of micro-batches, so no rank waits in an extra allreduce.

    ``set_epoch(epoch, start)`` begins an epoch at global sample offset ``start`` (0, or what
    ``position(steps)`` returned when a run stopped after ``steps`` optimizer steps of that epoch),
    at whatever world size the job has now. ``rank`` and ``size`` default to the job's (``rank_``
    and ``size_`` are their deprecated names).
    """

    def __init__(
        self,
        n: int,
        batch_size: int,
        global_batch_size: int | None = None,
        accumulation: int = 1,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = False,
        rank: int | None = None,
        size: int | None = None,
        *,
        rank_: int | None = None,
        size_: int | None = None,
    ) -> None:
        size = renamed_argument(size_, size, "TrainSampler(size_=)", "size=")
        rank = renamed_argument(rank_, rank, "TrainSampler(rank_=)", "rank=")
        self.size = runtime.size() if size is None else size
        self.rank = runtime.rank() if rank is None else rank
        self.plan = plan_batches(batch_size, self.size, global_batch_size, accumulation)
        self.n = self.plan.check_dataset(int(n))
        self.shuffle, self.seed, self.drop_last = shuffle, seed, drop_last
        self.set_epoch(0)

    @property
    def accumulation(self) -> int:
        """Backward passes per optimizer step on this world size (pass it as ``backward_passes_per_step``)."""
        return self.plan.accumulation

    def set_epoch(self, epoch: int, start: int = 0) -> None:
        """Begin ``epoch`` at global sample offset ``start`` (samples of the epoch already trained on)."""
        self.epoch, self.start = int(epoch), int(start)
        self.bounds = step_bounds(self.n, self.start, self.plan.global_batch_size, self.plan.slots, self.drop_last)

    @property
    def steps(self) -> int:
        """Optimizer steps left in this epoch from its start offset."""
        return len(self.bounds)

    def position(self, steps: int) -> int:
        """The global sample offset after ``steps`` optimizer steps since ``set_epoch``: save it to resume there."""
        return position_after(self.bounds, steps, self.start)

    def __iter__(self) -> Iterator[list[int]]:
        order = epoch_order(self.n, self.seed, self.epoch, self.shuffle)
        return rank_batches(order, self.bounds, self.rank, self.size, self.plan.accumulation)

    def __len__(self) -> int:
        return self.steps * self.plan.accumulation


class TrainLoader(DataLoader):
    """A DataLoader over a ``TrainSampler``; ``loader.sampler`` is that sampler (``set_epoch``, ``position``).

    Iterating yields micro-batches: ``accumulation`` of them make one optimizer step.
    """

    @property
    def sampler(self) -> TrainSampler:
        return self.batch_sampler

    @sampler.setter
    def sampler(self, value: Any) -> None:
        """DataLoader sets its per-sample default here; with a batch sampler it is never used."""

    @property
    def accumulation(self) -> int:
        """Backward passes per optimizer step (``backward_passes_per_step``)."""
        return self.batch_sampler.accumulation

    @property
    def plan(self) -> BatchPlan:
        """The ``BatchPlan`` (per-rank batch, ranks, accumulation, global batch)."""
        return self.batch_sampler.plan

    def set_epoch(self, epoch: int, start: int = 0) -> None:
        """``sampler.set_epoch(epoch, start)``."""
        self.batch_sampler.set_epoch(epoch, start)

    def position(self, steps: int) -> int:
        """``sampler.position(steps)``: the global sample offset to save after ``steps`` steps of this epoch."""
        return self.batch_sampler.position(steps)


class EvalSampler(Sampler):
    """Every sample exactly once over all ranks, no padding: rank r gets indices r, r+size, ...

    Shards differ by at most one sample; average metrics with sample counts (``MetricTracker``)
    so the result equals the metric over the whole dataset. ``size`` and ``rank`` default to the
    job's (``num_replicas`` and ``rank_`` are their deprecated names).
    """

    def __init__(
        self,
        dataset: Sized,
        size: int | None = None,
        rank: int | None = None,
        *,
        num_replicas: int | None = None,
        rank_: int | None = None,
    ) -> None:
        size = renamed_argument(num_replicas, size, "EvalSampler(num_replicas=)", "size=")
        rank = renamed_argument(rank_, rank, "EvalSampler(rank_=)", "rank=")
        self.n = len(dataset)
        self.size = runtime.size() if size is None else size
        self.rank = runtime.rank() if rank is None else rank

    def __iter__(self) -> Iterator[int]:
        return iter(range(self.rank, self.n, self.size))

    def __len__(self) -> int:
        return max(0, math.ceil((self.n - self.rank) / self.size))

    def set_epoch(self, epoch: int) -> None:
        """Evaluation order does not change with the epoch (kept for a uniform loop)."""


def train_loader(
    dataset: Dataset,
    batch_size: int,
    shuffle: bool = True,
    seed: int = 0,
    drop_last: bool = False,
    global_batch_size: int | None = None,
    backward_passes_per_step: int = 1,
    **kwargs: Any,
) -> TrainLoader:
    """A ``TrainLoader`` over this rank's micro-batches of ``dataset`` (see ``TrainSampler``).

        loader = hk.train_loader(train_set, batch_size=32, global_batch_size=64, seed=0)
        opt = hk.DistributedOptimizer(sgd, model=model, backward_passes_per_step=loader.accumulation)
        for epoch in range(start_epoch, epochs):
            loader.sampler.set_epoch(epoch, start=offset)   # offset: 0, or the saved position
            for i, (x, y) in enumerate(loader, 1):
                (loss_fn(model(x), y) / loader.accumulation).backward()
                if i % loader.accumulation == 0:
                    opt.step(); opt.zero_grad()

    ``global_batch_size``: samples per optimizer step over all ranks, kept at any world size by
    choosing ``loader.accumulation`` (``hvdkit.core.data.plan_batches``; ConfigError on every
    rank when ``batch_size`` x ranks does not divide it). Without it the accumulation is
    ``backward_passes_per_step`` and the global batch follows the world size. Rank 0 logs the plan
    ("world size 1: global batch 64 = 32 per rank x 1 rank x 2 accumulation steps").
    ``kwargs`` go to the DataLoader (``num_workers``, ``collate_fn``, ...).
    """
    sampler = TrainSampler(
        len(dataset), batch_size, global_batch_size, backward_passes_per_step, shuffle, seed, drop_last
    )
    if sampler.rank == 0:
        _log.info("%s", sampler.plan.describe())
    generator = torch.Generator().manual_seed(seed)
    return TrainLoader(dataset, batch_sampler=sampler, generator=generator, **kwargs)


def eval_loader(dataset: Dataset, batch_size: int, **kwargs: Any) -> DataLoader:
    """A DataLoader over this rank's evaluation shard (see ``EvalSampler``)."""
    return DataLoader(dataset, batch_size=batch_size, sampler=EvalSampler(dataset), **kwargs)
