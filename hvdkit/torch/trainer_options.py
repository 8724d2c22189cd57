"""``TrainerOptions``: the options of ``hvdkit.torch.Trainer`` as one frozen, checked record.

The Trainer builds it from its keyword arguments first thing; the checks are local (no collective),
so every rank raises the same ConfigError, naming the bad value and the fix, before anything starts.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from ..core.checkpoint.background import writer_nice
from ..core.errors import ConfigError
from ..core.lr import RULES
from ..core.options import check_compression, check_int_at_least, check_number_above, check_positive_int
from ..core.recovery import check_commit_every
from . import zero
from .monitoring import Tracker
from .trainer_parts import check_callbacks

__all__ = ["TrainerOptions", "PRECISIONS", "INTERVALS"]

PRECISIONS = ("fp32", "bf16", "fp16")
INTERVALS = ("epoch", "step")


@dataclass(frozen=True)
class TrainerOptions:
    """The checked options of one ``hk.Trainer``: the fields are its constructor's parameters, same names.

    Built by ``Trainer.__init__`` from its arguments (their meaning and defaults are documented there).
    A few are kept in the form the loop uses: ``metrics`` a dict (``{}`` for None), ``callbacks`` a
    list, ``checkpoint_every`` None for ``"epoch"`` (else the optimizer steps between checkpoints),
    ``compression`` the checked name. A bad value raises ConfigError naming it and the fix.
    """

    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    loss_fn: Callable[[Any, Any], torch.Tensor]
    metrics: Mapping[str, Callable[[Any, Any], Any]] | None
    batch_size: int
    global_batch_size: int | None
    backward_passes_per_step: int
    eval_batch_size: int | None
    shuffle: bool
    drop_last: bool
    num_workers: int
    checkpoint_dir: str | os.PathLike[str] | None
    checkpoint_every: int | str | None
    keep: int
    async_save: bool
    compression: str
    max_grad_norm: float | None
    shard_optimizer_state: bool
    precision: str
    lr_rule: str
    warmup_steps: int
    scheduler: Callable[[torch.optim.Optimizer], Any] | None
    scheduler_interval: str
    callbacks: Iterable[Any]
    tracking: str | os.PathLike[str] | Tracker | None
    progress: bool
    straggler_threshold: float | None
    seed: int
    commit_every: int | str
    writer_priority: str = "auto"

    def __post_init__(self) -> None:
        _check_parts(self.model, self.optimizer, self.loss_fn)
        self._set("metrics", _check_metrics(self.metrics))
        self._set("batch_size", check_positive_int("batch_size", self.batch_size, "the per-rank batch size, e.g. 32"))
        if self.global_batch_size is not None:
            check_positive_int("global_batch_size", self.global_batch_size, "or None: batch_size x ranks")
        if self.eval_batch_size is not None:
            check_positive_int("eval_batch_size", self.eval_batch_size, "or None: batch_size")
        check_positive_int("backward_passes_per_step", self.backward_passes_per_step)
        self._set("checkpoint_every", _check_every(self.checkpoint_every))
        check_positive_int("keep", self.keep, "the number of newest checkpoints kept, e.g. 3")
        self._set("compression", check_compression(self.compression, allow_auto=True))
        if self.max_grad_norm is not None:
            check_number_above("max_grad_norm", self.max_grad_norm, 0.0, "or None: no clipping")
        if self.precision not in PRECISIONS:
            raise ConfigError(f"precision must be one of {PRECISIONS} (got {self.precision!r})")
        if not isinstance(self.shard_optimizer_state, bool):
            raise ConfigError(f"shard_optimizer_state must be True or False (got {self.shard_optimizer_state!r})")
        if self.shard_optimizer_state:
            zero.check_shardable(self.optimizer)  # LBFGS and the like: refused here, on every rank alike
        self._check_rates()
        self._set("callbacks", check_callbacks(self.callbacks))
        check_int_at_least("seed", self.seed, 0)
        check_int_at_least("num_workers", self.num_workers, 0)
        check_commit_every(self.commit_every)
        self._check_monitoring()
        writer_nice(self.writer_priority)  # ConfigError naming the choices

    def _set(self, name, value):
        object.__setattr__(self, name, value)  # a checked form of a field, once, while it is built

    def _check_rates(self):
        if self.lr_rule not in RULES:
            raise ConfigError(f"lr_rule must be one of {tuple(RULES)} (got {self.lr_rule!r})")
        if self.lr_rule != "none" and self.global_batch_size is not None:
            raise ConfigError(
                f"lr_rule={self.lr_rule!r} scales the rate with the ranks, but "
                f"global_batch_size={self.global_batch_size} keeps the batch the same at any world size; "
                "use lr_rule='none' with a global batch"
            )
        check_int_at_least("warmup_steps", self.warmup_steps, 0)
        _check_scheduler(self.scheduler, self.scheduler_interval)

    def _check_monitoring(self):
        tracking = self.tracking
        if tracking is not None and not isinstance(tracking, (str, os.PathLike, Tracker)):
            raise ConfigError(
                f"tracking must be None, a log directory or an hk.Tracker (got {type(tracking).__name__}); "
                "e.g. tracking='runs/exp1' for TensorBoard"
            )
        if self.straggler_threshold is not None:
            check_number_above("straggler_threshold", self.straggler_threshold, 1.0, "or None: no straggler report")


def _check_parts(model, opt, loss_fn):
    if not isinstance(model, torch.nn.Module):
        raise ConfigError(f"model must be a torch.nn.Module (got {type(model).__name__})")
    if not isinstance(opt, torch.optim.Optimizer):
        raise ConfigError(
            f"optimizer must be a torch.optim.Optimizer (got {type(opt).__name__}); "
            "e.g. torch.optim.SGD(model.parameters(), lr=0.1)"
        )
    if hasattr(opt, "skip_synchronize") or isinstance(opt, zero.ShardedOptimizer):
        raise ConfigError(
            "optimizer is already distributed (hk.DistributedOptimizer or Horovod's); pass the plain torch "
            "optimizer: the Trainer wraps it (compression=, max_grad_norm= are Trainer options)"
        )
    if not callable(loss_fn):
        raise ConfigError(
            f"loss_fn must be callable as loss_fn(output, target) (got {type(loss_fn).__name__}); "
            "e.g. torch.nn.functional.cross_entropy"
        )


def _check_metrics(metrics):
    if metrics is None:
        return {}
    if not isinstance(metrics, Mapping):
        raise ConfigError(
            f"metrics must map a name to fn(output, target) -> tensor (got {type(metrics).__name__}); "
            "e.g. metrics={'accuracy': lambda out, y: (out.argmax(1) == y).float().mean()}"
        )
    for name, fn in metrics.items():
        if not isinstance(name, str) or not name or name == "loss" or name.startswith("val_"):
            raise ConfigError(
                f"metric name {name!r} is not usable: names are non-empty strings other than 'loss' and not "
                "starting with 'val_' (the validation value of metric 'acc' is logged as 'val_acc')"
            )
        if not callable(fn):
            raise ConfigError(f"metrics[{name!r}] must be callable as fn(output, target) (got {type(fn).__name__})")
    return dict(metrics)


def _check_every(value):
    if value == "epoch":
        return None
    return check_positive_int(
        "checkpoint_every", value, "pass 'epoch' (at each epoch end) or a number of optimizer steps, e.g. 100"
    )


def _check_scheduler(scheduler, interval):
    if scheduler is not None and (
        isinstance(scheduler, torch.optim.lr_scheduler.LRScheduler) or not callable(scheduler)
    ):
        raise ConfigError(
            "scheduler must be a function that builds it on the trainer's optimizer "
            f"(got {type(scheduler).__name__}); "
            "e.g. scheduler=lambda opt: torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=10)"
        )
    if interval not in INTERVALS:
        raise ConfigError(f"scheduler_interval must be one of {INTERVALS} (got {interval!r})")
