"""What ``hvdkit.torch.Trainer`` is made of besides its loop and its options (``trainer_options.py``):
``History``, the callbacks, and the learning-rate/loss-scale state it checkpoints."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..core.errors import ConfigError

__all__ = [
    "History",
    "CALLBACK_METHODS",
    "check_callbacks",
    "LearningState",
    "call_callbacks",
]

CALLBACK_METHODS = ("on_train_begin", "on_train_batch_end", "on_epoch_end", "on_train_end")


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
