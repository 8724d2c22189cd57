"""``hk.elastic.fit``'s stop on a signal and its resume from disk: a ``PreemptionGuard`` checked after every
optimizer step, and the ``hk.CheckpointCallback`` among ``fit``'s callbacks, which it writes and restores itself."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import keras

from ...core.errors import ConfigError
from ...core.log import get_logger
from ...tensorflow import runtime
from ..callbacks import CheckpointCallback
from .metrics import check

__all__ = ["Preemption", "checkpoint_callback", "extra", "position"]

_log = get_logger("elastic")


def checkpoint_callback(callbacks: list[Any]) -> tuple[CheckpointCallback | None, list[Any]]:
    """``(the hk.CheckpointCallback of callbacks or None, the others)``: ``fit`` writes that one itself (at the
    epoch ends it would, and at a stop mid-epoch, with the position and the History), so it is left out of
    ``model.fit``'s callbacks, where Keras would also write it at the end of an epoch a stop cut short."""
    found = [cb for cb in callbacks if isinstance(cb, CheckpointCallback)]
    if len(found) > 1:
        raise ConfigError(
            f"hk.elastic.fit takes one hk.CheckpointCallback (got {len(found)}: "
            f"{', '.join(repr(str(cb.directory)) for cb in found)}); pass the one it should resume from"
        )
    return (found[0] if found else None), [cb for cb in callbacks if not isinstance(cb, CheckpointCallback)]


def position(resumed: Any) -> dict[str, Any]:
    """The ``State`` values ``fit`` goes on from after ``resumed`` (a ``Resumed``, or None: a fresh start):
    epoch, optimizer step, the epoch's sample offset, the History's ``{epoch: logs}`` and the metric state of the
    epoch's batches before the offset (``metrics.gather``'s, or None). A checkpoint that ``hk.CheckpointCallback``
    wrote at an epoch end outside ``fit`` has no ``extra``: offset 0, no History."""
    if resumed is None:
        return {"epoch": 0, "step": 0, "samples_done": 0, "history": {}, "metrics": None}
    extra = resumed.extra if isinstance(resumed.extra, dict) else {}
    done = extra.get("samples_done", 0)
    if isinstance(done, bool) or not isinstance(done, int) or done < 0:
        raise ConfigError(
            f"checkpoint {resumed.path} holds samples_done={done!r}, not a sample offset (a whole number >= 0); "
            "point the checkpoint directory at checkpoints hk.elastic.fit wrote, or at an empty directory"
        )
    history = extra.get("history") or {}
    return {
        "epoch": int(resumed.epoch),
        "step": int(resumed.step),
        "samples_done": done,
        "history": {int(e): dict(logs) for e, logs in history.items()},
        "metrics": check(extra.get("metrics"), f"checkpoint {resumed.path}") if done else None,
    }


def extra(samples_done: int, history: dict[int, dict[str, Any]], metrics: Any = None) -> dict[str, Any]:
    """What a checkpoint of ``fit`` holds beyond the model: the epoch's sample offset and the metric state of the
    epoch's batches so far (``metrics.gather``'s; both mid-epoch only), and the History of the epochs completed, so
    that a resumed ``fit`` logs the whole epoch's metrics and returns the whole run's History."""
    out: dict[str, Any] = {"history": {int(e): dict(logs) for e, logs in history.items()}}
    if samples_done:
        out["samples_done"] = int(samples_done)
        if metrics is not None:
            out["metrics"] = metrics
    return out


class Preemption:
    """The stop of one ``hk.elastic.fit`` call: the guard of each training (``guarded``: one per (re)start, as
    the torch Trainer's; ``hk.elastic.run`` holds a signal that comes between two of them for the next) and the
    checkpoint callback (None: nothing is written).
    Collective: every rank calls ``should_stop`` after every optimizer step, and ``save`` alike."""

    def __init__(self, ckpt: CheckpointCallback | None, model: keras.Model) -> None:
        self.ckpt = ckpt
        self.guard = None
        if ckpt is not None:
            ckpt.set_model(model)  # left out of model.fit's callbacks: Keras does not set it

    @contextlib.contextmanager
    def guarded(self) -> Iterator[None]:
        """A guard installed while the body (one training) runs; a stop signal held since the last one
        (``hold_stop_signals``) is this one's, and stops it at its first check."""
        self.guard = runtime.PreemptionGuard()
        try:
            yield
        finally:
            self.guard.close()
            self.guard = None

    def restore(self) -> Any:
        """The newest good checkpoint loaded on every rank (a ``Resumed``), or None. Collective."""
        if self.ckpt is None:
            return None
        self.ckpt.restore()  # the deprecated hk.Checkpoint's returns the epoch: its ``resumed`` is the same
        return self.ckpt.resumed

    def should_stop(self, step: int) -> bool:
        """True on every rank alike once any rank received SIGTERM/SIGUSR1 (``PreemptionGuard``). Collective."""
        return self.guard.should_stop(step=step)

    def due(self, epochs_done: int) -> bool:
        """Whether the checkpoint callback writes at the end of epoch ``epochs_done`` (its ``every``)."""
        return self.ckpt is not None and epochs_done % self.ckpt.every == 0

    def save(self, epoch: int, samples_done: int, history: dict[int, dict[str, Any]], metrics: Any = None) -> None:
        """Write the checkpoint of this step (when there is a callback): ``epoch`` epochs completed, then
        ``samples_done`` samples of the next, whose metric state is ``metrics``. Collective."""
        if self.ckpt is not None:
            self.ckpt.save(epoch, extra=extra(samples_done, history, metrics))

    def say_stopped(self, epoch: int, step: int) -> None:
        saved = ": checkpoint saved" if self.ckpt is not None else " (no hk.CheckpointCallback: nothing saved)"
        if runtime.is_rank0():
            _log.info("stopped in epoch %d after step %d on a stop signal%s", epoch + 1, step, saved)
