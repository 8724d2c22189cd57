"""Gradient buckets for ``hk.DistributedOptimizer(..., bucket_mb=)``: DDP's grouping, on Horovod's groups.

DDP averages gradients in buckets of about 25 MB (the first, holding the gradients backward produces
first, about 1 MB so the first allreduce starts early), each started as soon as its last gradient is
produced. Horovod's optimizer can do the same with its public ``groups=`` argument: a group's
gradients go to the engine in one grouped allreduce once the last of them is ready. This module
plans those groups: the trainable parameters in backward order (the reverse of the order they were
registered in, as DDP assumes before its first step), split by dtype and device, cut into buckets.
Averaging a bucket changes no bit of any gradient: the same elements are summed over the same ranks
(``tests/distributed/test_buckets_torch.py`` checks it on 2 ranks).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import torch

from ..core.errors import ConfigError

__all__ = ["AUTO_GPU_BUCKET_MB", "FIRST_BUCKET_MB", "check_bucket_mb", "plan_buckets", "resolve_bucket_mb"]

FIRST_BUCKET_MB = 1.0  # DDP's first bucket (torch.distributed's _DEFAULT_FIRST_BUCKET_BYTES, 1 MiB)
# bucket_mb="auto" where the parameters are on a GPU: DDP's bucket size. Measured on an H200 (2 ranks
# sharing it, NCCL, docs/gpu.md 2026-11-28): ResNet-50 1.04-1.05x DDP's step, BERT-base 1.04-1.05x, at
# the GPU cycle time (hvdkit.core.horovod_settings); without buckets 0.95x and 1.05x.
AUTO_GPU_BUCKET_MB = 25.0
MB = 1 << 20


def check_bucket_mb(value: Any) -> float | None:
    """``value`` as a bucket size in MiB, or None (bucketing off: None or 0); ConfigError otherwise."""
    if value is None or (not isinstance(value, bool) and value == 0):
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise ConfigError(
            f"bucket_mb must be a number of MiB > 0, or None or 0 for no buckets (got {value!r}); "
            "e.g. bucket_mb=25, DDP's bucket size"
        )
    return float(value)


def resolve_bucket_mb(value: Any, devices: Iterable[torch.device], sparse: bool = False) -> float | None:
    """``bucket_mb`` as used: ``"auto"`` is ``AUTO_GPU_BUCKET_MB`` when one of ``devices`` (the trainable
    parameters') is a GPU and no gradient is sparse (``sparse``: the model has a sparse embedding), else
    None (no buckets: on the CPU, as measured there, Horovod's own tensor fusion); any other value as
    ``check_bucket_mb`` takes it."""
    if isinstance(value, str):
        if value != "auto":
            raise ConfigError(
                f'bucket_mb must be "auto", a number of MiB > 0, or None or 0 for no buckets (got {value!r}); '
                'e.g. bucket_mb=25, DDP\'s bucket size, or leave the default "auto"'
            )
        on_gpu = any(d.type == "cuda" for d in devices)
        return AUTO_GPU_BUCKET_MB if on_gpu and not sparse else None
    return check_bucket_mb(value)


def plan_buckets(
    param_groups: Iterable[Mapping[str, Any]], bucket_mb: float, first_mb: float = FIRST_BUCKET_MB
) -> list[list[torch.Tensor]]:
    """The parameters requiring a gradient, in backward order, cut into buckets of ``bucket_mb`` MiB.

    Backward order is the reverse of the order in ``param_groups``. A bucket is closed once its
    gradients reach the bucket's size (the first one's is ``min(first_mb, bucket_mb)``), so a
    parameter larger than that has a bucket of its own; parameters of another dtype or device
    than the bucket being filled go to a bucket of their own kind (one open bucket per kind).
    The plan depends only on the parameters' order, shapes and ``requires_grad``: the same on
    every rank of a job whose ranks build the same model.
    """
    params: list[torch.Tensor] = [p for group in param_groups for p in group["params"] if p.requires_grad]
    return _cut(list(reversed(params)), bucket_mb * MB, min(first_mb, bucket_mb) * MB)


def _cut(params: Sequence[torch.Tensor], cap: float, first_cap: float) -> list[list[torch.Tensor]]:
    buckets: list[list[torch.Tensor]] = []
    open_: dict[tuple[torch.dtype, torch.device], tuple[list[torch.Tensor], int]] = {}
    for p in params:
        kind = (p.dtype, p.device)
        bucket, size = open_.get(kind, ([], 0))
        if not bucket:
            buckets.append(bucket)
        bucket.append(p)
        size += p.numel() * p.element_size()
        if size >= (first_cap if buckets[0] is bucket else cap):
            open_.pop(kind, None)
        else:
            open_[kind] = (bucket, size)
    return buckets
