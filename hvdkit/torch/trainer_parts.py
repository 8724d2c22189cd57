"""What ``hvdkit.torch.Trainer`` is made of besides its loop: the checks of its arguments (before any
collective), ``History``, the callbacks, and the learning-rate/loss-scale state it checkpoints."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from ..core.errors import ConfigError
from ..core.lr import RULES
from ..core.options import check_compression, check_int_at_least, check_number_above, check_positive_int
from . import zero
from .monitoring import Tracker

__all__ = [
    "History",
    "PRECISIONS",
    "CALLBACK_METHODS",
    "check_options",
    "check_callbacks",
    "LearningState",
    "call_callbacks",
]

PRECISIONS = ("fp32", "bf16", "fp16")
CALLBACK_METHODS = ("on_train_begin", "on_train_batch_end", "on_epoch_end", "on_train_end")
INTERVALS = ("epoch", "step")


@dataclass
class History:
    """What ``Trainer.fit`` did: per-epoch values of the epochs this call ran, the same on every rank.

    ``history`` maps ``loss``, each ``<metric>``, ``val_loss``, ``val_<metric>`` (with ``val_data``),
    ``lr`` (the rate of the epoch's last step) and ``epoch_time`` (seconds, the mean over ranks) to
    lists, one value per epoch in ``epoch`` (0-based). ``resumed_from_epoch``: the epoch this call
    started in (0 on a fresh start; the epochs a checkpoint had completed otherwise); ``step``: the
    optimizer steps done over the whole run at the end; ``stopped``: True when a preemption (SIGTERM,
    an elastic request) or a callback's ``stop_training`` ended the call mid-epoch, after saving a
    checkpoint of the step (the next call continues from it).
    """

    history: dict[str, list[float]] = field(default_factory=dict)
    epoch: list[int] = field(default_factory=list)
    resumed_from_epoch: int = 0
    step: int = 0
    stopped: bool = False

    def append(self, epoch: int, logs: Mapping[str, float]) -> None:
        """Record ``logs`` (name -> value) for ``epoch``."""
        self.epoch.append(epoch)
        for name, value in logs.items():
            self.history.setdefault(name, []).append(float(value))


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


def check_callbacks(callbacks: Iterable[Any]) -> list[Any]:
    """The callbacks as a list; ConfigError for one that has none of ``CALLBACK_METHODS``."""
    if callbacks is None:
        return []
    try:
        items = list(callbacks)
    except TypeError:
        raise ConfigError(
            f"callbacks must be a list of objects (got {type(callbacks).__name__}); e.g. callbacks=[MyCallback()]"
        ) from None
    for cb in items:
        if not any(callable(getattr(cb, m, None)) for m in CALLBACK_METHODS):
            raise ConfigError(
                f"callback {cb!r} has none of the methods {', '.join(CALLBACK_METHODS)}; "
                "pass an object (not a class) that defines at least one of them"
            )
    return items


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


def check_options(o: Mapping[str, Any]) -> dict[str, Any]:
    """Checked copies of the Trainer's options; ConfigError naming the value and the fix.

    Only local checks: every rank raises the same error before any collective.
    """
    if not isinstance(o["model"], torch.nn.Module):
        raise ConfigError(f"model must be a torch.nn.Module (got {type(o['model']).__name__})")
    opt = o["optimizer"]
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
    if not callable(o["loss_fn"]):
        raise ConfigError(
            f"loss_fn must be callable as loss_fn(output, target) (got {type(o['loss_fn']).__name__}); "
            "e.g. torch.nn.functional.cross_entropy"
        )
    out = dict(o)
    out["metrics"] = _check_metrics(o["metrics"])
    out["batch_size"] = check_positive_int("batch_size", o["batch_size"], "the per-rank batch size, e.g. 32")
    if o["global_batch_size"] is not None:
        check_positive_int("global_batch_size", o["global_batch_size"], "or None: batch_size x ranks")
    if o["eval_batch_size"] is not None:
        check_positive_int("eval_batch_size", o["eval_batch_size"], "or None: batch_size")
    check_positive_int("backward_passes_per_step", o["backward_passes_per_step"])
    out["checkpoint_every"] = _check_every(o["checkpoint_every"])
    check_positive_int("keep", o["keep"], "the number of newest checkpoints kept, e.g. 3")
    out["compression"] = check_compression(o["compression"], allow_auto=True)
    if o["max_grad_norm"] is not None:
        check_number_above("max_grad_norm", o["max_grad_norm"], 0.0, "or None: no clipping")
    if o["precision"] not in PRECISIONS:
        raise ConfigError(f"precision must be one of {PRECISIONS} (got {o['precision']!r})")
    if not isinstance(o["shard_optimizer_state"], bool):
        raise ConfigError(f"shard_optimizer_state must be True or False (got {o['shard_optimizer_state']!r})")
    if o["shard_optimizer_state"]:
        zero.check_shardable(opt)  # LBFGS and the like: refused here, on every rank alike
    if o["lr_rule"] not in RULES:
        raise ConfigError(f"lr_rule must be one of {tuple(RULES)} (got {o['lr_rule']!r})")
    if o["lr_rule"] != "none" and o["global_batch_size"] is not None:
        raise ConfigError(
            f"lr_rule={o['lr_rule']!r} scales the rate with the ranks, but global_batch_size={o['global_batch_size']} "
            "keeps the batch the same at any world size; use lr_rule='none' with a global batch"
        )
    check_int_at_least("warmup_steps", o["warmup_steps"], 0)
    _check_scheduler(o["scheduler"], o["scheduler_interval"])
    out["callbacks"] = check_callbacks(o["callbacks"])
    check_int_at_least("seed", o["seed"], 0)
    check_int_at_least("num_workers", o["num_workers"], 0)
    if o["commit_every"] != "auto":
        check_positive_int(
            "commit_every",
            o["commit_every"],
            "pass 'auto' (commits cost at most 2 % of the time) or a number of optimizer steps, e.g. 50",
        )
    tracking = o["tracking"]
    if tracking is not None and not isinstance(tracking, (str, os.PathLike, Tracker)):
        raise ConfigError(
            f"tracking must be None, a log directory or an hk.Tracker (got {type(tracking).__name__}); "
            "e.g. tracking='runs/exp1' for TensorBoard"
        )
    if o["straggler_threshold"] is not None:
        check_number_above("straggler_threshold", o["straggler_threshold"], 1.0, "or None: no straggler report")
    return out


class LearningState:
    """The rate rule's scheduler, the user's scheduler and the fp16 loss scaler as one checkpointed state.

    ``hvdkit.torch.Checkpointer`` keeps one scheduler; this gives it the three in one dict, so a
    resumed run continues warmup, schedule and loss scale where they were.
    """

    def __init__(self, parts: Mapping[str, Any]) -> None:
        self.parts = {k: v for k, v in parts.items() if v is not None}

    def state_dict(self) -> dict[str, Any]:
        return {k: v.state_dict() for k, v in self.parts.items()}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if set(state) != set(self.parts):
            raise KeyError(f"the checkpoint holds {sorted(state)}, this trainer has {sorted(self.parts)}")
        for k, v in self.parts.items():  # the rate rule first: it rescales the restored rates
            v.load_state_dict(state[k])


def call_callbacks(callbacks: Iterable[Any], method: str, *args: Any) -> None:
    """``cb.method(*args)`` for every callback that has it."""
    for cb in callbacks:
        fn: Callable[..., Any] | None = getattr(cb, method, None)
        if callable(fn):
            fn(*args)
