"""hvdkit.torch's deprecated names, kept for one release (removed in hvdkit 0.3): each warns, then works.

The renamed keyword arguments of ``TrainSampler``/``EvalSampler`` (``rank_``, ``size_``,
``num_replicas``) are handled where they are taken (``hvdkit.core.deprecation.renamed_argument``).
"""

from __future__ import annotations

import torch

from ..core.deprecation import deprecated_function
from .optim import ScaledLRScheduler

__all__ = ["scale_lr"]


def _scaled_lr_scheduler(
    optimizer: torch.optim.Optimizer,
    rule: str = "linear",
    warmup_steps: int = 0,
    size: int | None = None,
    last_epoch: int = -1,
) -> ScaledLRScheduler:
    # ScaledLRScheduler's arguments, spelled out so that the old name shows them with their types.
    return ScaledLRScheduler(optimizer, rule, warmup_steps, size, last_epoch)


scale_lr = deprecated_function(_scaled_lr_scheduler, "hvdkit.torch.scale_lr", "hvdkit.torch.ScaledLRScheduler")
