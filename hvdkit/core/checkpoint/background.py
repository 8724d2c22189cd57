"""One checkpoint write at a time in a background thread of rank 0, and how its outcome reaches every rank.

An asynchronous save (``CheckpointStore.save(..., background=True)``) copies the state into host
memory while training waits, then hands the write (the same crash-safe protocol as a synchronous
save) to a thread. Only rank 0 writes, so only rank 0 learns whether the write worked: every rank
therefore calls ``settle`` at the same points (the next save, ``wait``, a restore), and rank 0
broadcasts the outcome there, so a failed write raises the same CheckpointError on every rank.

The thread is not a daemon: an interpreter that exits waits for the write. At exit, a write whose
outcome no rank asked for is reported on rank 0 (an error, logged), since a collective is no longer
safe then (the ranks may be exiting for different reasons).
"""

from __future__ import annotations

import atexit
import os
import threading
import time
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING

from ..errors import CheckpointError
from ..log import get_logger

if TYPE_CHECKING:
    from ..comm import Communicator

__all__ = ["BackgroundWrites"]

_log = get_logger("checkpoint")
_UNSHARED: weakref.WeakSet[BackgroundWrites] = weakref.WeakSet()  # writes whose outcome no rank asked for


# The write thread (and the hashing/syncing threads it starts, which inherit it) runs at this nice
# value (Linux schedules threads as tasks, each with its own nice value). 0: the write competes with
# training as an equal. 19 keeps a step's time as without a write (0.99x vs 3.97x for 1 GiB on 2 busy
# cores, docs/benchmarks.md) but the write then takes only what training leaves (about 20x longer
# there), so the newest checkpoint lags further behind a crash; on a GPU node the CPUs are mostly idle
# and it makes no difference. Kept at 0 until a per-checkpointer setting says which a job wants.
WRITER_NICE = 0


def _yield_to_training() -> None:
    """Lower the calling thread's scheduling priority to ``WRITER_NICE`` (Linux; elsewhere nothing)."""
    if WRITER_NICE <= 0:
        return
    try:
        tid = threading.get_native_id()
        if os.getpriority(os.PRIO_PROCESS, tid) < WRITER_NICE:
            os.setpriority(os.PRIO_PROCESS, tid, WRITER_NICE)
    except (AttributeError, OSError):  # no per-thread priority here: the write still happens, at full priority
        pass


class BackgroundWrites:
    """At most one write in flight (its thread on rank 0; the step on every rank) and its outcome.

    Collective: ``settle`` is called by every rank at the same points; ``start`` by every rank
    after the save's own broadcast said the write may start (it only starts a thread on rank 0).
    """

    def __init__(self, comm: Communicator, root: str) -> None:
        self.comm = comm
        self.root = root
        self.step: int | None = None  # the step whose write is in flight, or unsettled (every rank)
        self._thread: threading.Thread | None = None
        self._outcome: tuple[str, str] | None = None
        self._told_waiting = False

    @property
    def running(self) -> bool:
        """Whether rank 0's write thread is still writing (rank 0; False elsewhere)."""
        return self._thread is not None and self._thread.is_alive()

    def start(self, step: int, write: Callable[[], str]) -> None:
        """Start ``write()`` (returning the checkpoint's path) in a thread on rank 0; note ``step`` everywhere."""
        self.step = step
        _UNSHARED.add(self)
        if not self.comm.is_rank0:
            return
        self._outcome = None
        self._thread = threading.Thread(
            target=self._run, args=(step, write), name=f"hvdkit-ckpt-write-{step}", daemon=False
        )
        self._thread.start()

    def _run(self, step, write):
        _yield_to_training()
        try:
            self._outcome = ("ok", write())
        except Exception as e:  # noqa: BLE001 - any failure must reach every rank at the next settle
            self._outcome = (
                "error",
                f"the checkpoint of step {step} was not saved: writing it to {self.root!r} in the background "
                f"failed ({type(e).__name__}: {e}); the checkpoints before it are untouched",
            )

    def _join(self, step):
        """Rank 0: wait for the thread writing ``step``; ``(outcome, seconds waited, whether it was still writing)``."""
        thread, self._thread = self._thread, None
        busy = thread is not None and thread.is_alive()  # before it was taken: self.running is False now
        t0 = time.perf_counter()
        if busy:
            _log.debug("waiting for the background write of step %d", step)
            thread.join()
        if thread is None and self._outcome is None:  # rank 0 now, but another process was rank 0 and wrote it
            outcome = (
                "lost",
                f"the checkpoint of step {step} was being written in the background by the process that was rank 0, "
                "which is gone (in-process recovery): it may be incomplete, and is only used if it verifies; "
                "the next save writes a new one",
            )
        else:
            outcome = self._outcome or ("error", f"the checkpoint of step {step} was not saved (no outcome)")
        return outcome, time.perf_counter() - t0, busy

    def settle(self, next_step: int | None = None) -> str | None:
        """Wait for the write in flight and share its outcome: its path, or None when none was in flight.

        ``next_step``: the step a save is about to write (then rank 0 says, once, that it had to wait).
        Raises CheckpointError on every rank when the write failed (the outcome is then settled).
        Collective: every rank calls it (it communicates only when a write was started).
        """
        if self.step is None:
            return None
        step, outcome = self.step, None
        self.step = None
        _UNSHARED.discard(self)
        if self.comm.is_rank0:
            outcome, waited, busy = self._join(step)
            if busy and next_step is not None and not self._told_waiting:
                self._told_waiting = True
                _log.warning(
                    "the save of step %d waited %.3f s for the background write of step %d (one write at a "
                    "time): saves come faster than the disk takes them; save less often (said once)",
                    next_step,
                    waited,
                    step,
                )
        status, value = self.comm.broadcast_object(outcome, name="hvdkit.checkpoint.written")
        if status == "lost":
            if self.comm.is_rank0:
                _log.warning("%s", value)
            return None
        if status != "ok":
            raise CheckpointError(value)
        return value

    def settle_locally(self) -> None:
        """After an in-process recovery or join, no collective (a joining worker notes no write in flight, the
        others do): this process's own write thread, if any, is waited for (a failure logged), and the write
        is forgotten on every rank, so the next ``settle`` is the same on all of them."""
        if self.step is None:
            return
        step, self.step = self.step, None
        _UNSHARED.discard(self)
        if self._thread is not None:
            outcome, _, _ = self._join(step)
            if outcome[0] != "ok":
                _log.error("%s (found after a recovery)", outcome[1])

    def finish_locally(self, when: str = "at exit") -> None:
        """Rank 0, no collective (exit, close): wait for the write; log its failure, which no rank asked for."""
        if self.step is None or not self.comm.is_rank0:
            return
        outcome, _, _ = self._join(self.step)
        self.step = None
        _UNSHARED.discard(self)
        if outcome[0] != "ok":
            _log.error("%s (found %s; call Checkpointer.wait() to raise it on every rank)", outcome[1], when)


@atexit.register
def _finish_at_exit():
    for writes in list(_UNSHARED):
        writes.finish_locally()
