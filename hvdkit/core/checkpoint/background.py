"""One checkpoint write at a time in a background thread of rank 0, and how its outcome reaches every rank.

An asynchronous save (``CheckpointStore.save(..., background=True)``) hands the write (the same
crash-safe protocol as a synchronous save) to a thread. The copy of the state into host memory is
either made while training waits (the caller's ``check``) or, when the caller can gate whatever
changes the state (an optimizer's ``step()``), by that thread first (``copy``): ``wait_for_copies``
is the gate, a cheap check once the copy is done. Only rank 0 writes, so only rank 0 learns
whether the write worked: every rank therefore calls ``settle`` at the same points (the next
save, ``wait``, a restore), and rank 0 broadcasts the outcome there, so a failed write raises
the same CheckpointError on every rank. The thread itself never calls the communicator (everything it
needs from it is read by ``save``): under ``--recovery in-process`` a reset shuts Horovod down while a
write may be in flight, and the write must still finish.

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

from ..errors import CheckpointError, ConfigError
from ..log import get_logger

if TYPE_CHECKING:
    from ..comm import Communicator

__all__ = [
    "AUTO_PRIORITY",
    "BackgroundWrites",
    "WRITER_PRIORITIES",
    "DIRECT_IO",
    "choose_writer_priority",
    "wait_for_copies",
    "writer_nice",
    "writes_direct",
]

_log = get_logger("checkpoint")
_UNSHARED: weakref.WeakSet[BackgroundWrites] = weakref.WeakSet()  # writes whose outcome no rank asked for


# The write thread (and the hashing/syncing threads it starts, which inherit it) runs at the nice value
# of the checkpointer's ``writer_priority`` (Linux schedules threads as tasks, each with its own nice
# value). "normal" (0): the write competes with training as an equal and is on disk soonest. "low" (19):
# a step keeps its time while a write runs (0.99x vs 3.97x for 1 GiB on 2 busy cores), but the write
# takes only what training leaves (about 20x longer there), so the newest checkpoint lags further behind
# a crash. "idle": Linux's SCHED_IDLE as well (nice 19 where that is refused): the write runs only on a
# core training leaves, and a training thread that wakes takes the core from it at once, where a nice-19
# task may first finish its time slice (which a step split over torch's threads waits for). "auto" (the
# default) is "idle" where training leaves a core to the write (its state on an accelerator, or fewer compute
# threads on the host than cores: there "idle" kept the steps at 0.96-0.99x, its write as fast as at "normal"),
# else "normal" (every core trains: "idle" then made the write 2-3x longer and cost more training time in all).
# The measurements: docs/checkpoint-format.md, "Writer priority".
WRITER_PRIORITIES = {"normal": 0, "low": 19, "idle": 19}
_IDLE_POLICY = "idle"
AUTO_PRIORITY = "auto"
DEFAULT_WRITER_PRIORITY = AUTO_PRIORITY
# Whether a checkpoint's arrays file is written with O_DIRECT (``direct``: not through the page cache, where the
# file system takes it) when the checkpointer's ``direct_io`` is left None: by its ``writer_priority``.
DIRECT_IO = {"normal": False, "low": False, "idle": False}
_COPYING: weakref.WeakSet[BackgroundWrites] = weakref.WeakSet()  # saves whose state may still be being copied
_COPYING_LOCK = threading.Lock()  # _COPYING is changed by the thread that saves and read by the one that steps


def writer_nice(priority: str) -> int:
    """The nice value of a ``writer_priority`` ("normal", "low", "idle"; "auto": 0 until chosen, see
    ``choose_writer_priority``); ConfigError naming the choices otherwise."""
    if not isinstance(priority, str) or (priority not in WRITER_PRIORITIES and priority != AUTO_PRIORITY):
        raise ConfigError(
            f"writer_priority must be one of {sorted([*WRITER_PRIORITIES, AUTO_PRIORITY])} (got {priority!r}): "
            "'normal' writes a background checkpoint at training's priority (on disk soonest), 'low' yields the "
            "CPUs to training, 'idle' writes only on CPU time training leaves, 'auto' (the default) is 'idle' where "
            "training leaves a core free (a GPU, or fewer threads than cores) and 'normal' where every core trains"
        )
    return WRITER_PRIORITIES.get(priority, 0)


def choose_writer_priority(
    priority: str, accelerator: bool, threads: int, local_size: int, cores: int | None = None
) -> tuple[str, str]:
    """``(priority, why)``: ``priority`` itself, or for "auto" "idle" where training leaves a core to the write (the
    state on an ``accelerator``, or ``threads`` compute threads per rank x ``local_size`` ranks fewer than this
    process's ``cores``) and "normal" where every core trains; ``why`` says which (for the log)."""
    writer_nice(priority)
    if priority != AUTO_PRIORITY:
        return priority, "as asked"
    if accelerator:
        return "idle", "the state is on an accelerator: the CPUs are left free while it trains"
    cores = len(os.sched_getaffinity(0)) if cores is None else cores
    used = max(1, int(threads)) * max(1, int(local_size))
    if used < cores:
        return "idle", f"{threads} thread(s) x {local_size} rank(s) on this host leave some of its {cores} cores free"
    return "normal", f"{threads} thread(s) x {local_size} rank(s) on this host keep its {cores} cores busy"


def writes_direct(priority: str, direct_io: bool | None) -> bool:
    """Whether a checkpoint's arrays are written with O_DIRECT: ``direct_io`` (True or False), or with None the way of
    ``priority`` (``DIRECT_IO``); ConfigError naming the choices for anything else (or for a bad priority)."""
    writer_nice(priority)
    if direct_io is None:
        return DIRECT_IO.get(priority, False)
    if not isinstance(direct_io, bool):
        raise ConfigError(
            f"direct_io must be True, False or None (got {direct_io!r}): True writes a checkpoint's arrays with "
            "O_DIRECT (not through the page cache, where the file system allows it), False through the page cache, "
            "None as writer_priority chooses"
        )
    return direct_io


def wait_for_copies() -> None:
    """Wait until every background save of this process has copied its state (a cheap check when none copies).

    The gate before anything that changes a saved state in place (an optimizer's ``step()``, a
    ``load_state_dict``): the copy is then the state at ``save()`` time. No collective.
    """
    if not _COPYING:
        return
    with _COPYING_LOCK:
        copying = list(_COPYING)
    for writes in copying:
        writes.wait_copied()


def _yield_to_training(priority: str) -> None:
    """Lower the calling thread's scheduling priority to ``priority``'s (Linux; elsewhere nothing).

    The threads it starts afterwards inherit both its nice value and its policy.
    """
    nice = WRITER_PRIORITIES[priority]
    if nice <= 0:
        return
    try:
        tid = threading.get_native_id()
        if os.getpriority(os.PRIO_PROCESS, tid) < nice:
            os.setpriority(os.PRIO_PROCESS, tid, nice)
    except (AttributeError, OSError):  # no per-thread priority here: the write still happens, at full priority
        return
    if priority == _IDLE_POLICY:
        try:  # on Linux a thread's id names that thread alone
            os.sched_setscheduler(tid, os.SCHED_IDLE, os.sched_param(0))
        except (AttributeError, OSError):  # refused (a seccomp profile, say): nice 19 stays
            pass


class BackgroundWrites:
    """At most one write in flight (its thread on rank 0; the step on every rank) and its outcome.

    Collective: ``settle`` is called by every rank at the same points; ``start`` by every rank
    after the save's own broadcast said the write may start (it only starts a thread on rank 0).
    """

    def __init__(self, comm: Communicator, root: str, priority: str = DEFAULT_WRITER_PRIORITY) -> None:
        writer_nice(priority)  # ConfigError for a bad name
        self.comm = comm
        self.root = root
        # the write's (not the copy's: training may be waiting for that); "auto" is a checkpointer's to choose (it
        # knows the training): a store made without one writes at "normal"
        self.priority = "normal" if priority == AUTO_PRIORITY else priority
        self.step: int | None = None  # the step whose write is in flight, or unsettled (every rank)
        self._thread: threading.Thread | None = None
        self._outcome: tuple[str, str] | None = None
        self._told_waiting = False
        self._copied = threading.Event()  # clear while the thread copies the state (rank 0)
        self._copied.set()

    @property
    def running(self) -> bool:
        """Whether rank 0's write thread is still writing (rank 0; False elsewhere)."""
        return self._thread is not None and self._thread.is_alive()

    @property
    def copying(self) -> bool:
        """Whether rank 0's write thread is still copying the state of the save in flight (False elsewhere)."""
        return not self._copied.is_set()

    def wait_copied(self) -> None:
        """Wait until the thread has copied the state of the save in flight (returns at once when it has).

        No collective: only rank 0 copies; on the other ranks it returns at once.
        """
        if not self._copied.is_set():
            self._copied.wait()

    def start(self, step: int, write: Callable[[], str], copy: Callable[[], object] | None = None) -> None:
        """Start ``write()`` (returning the checkpoint's path) in a thread on rank 0; note ``step`` everywhere.

        ``copy()``, when given, runs first in the same thread at training's priority, before the thread
        lowers its priority for the write; ``wait_copied`` and ``wait_for_copies`` wait for it.
        """
        self.step = step
        _UNSHARED.add(self)
        if not self.comm.is_rank0:
            return
        self._outcome = None
        if copy is not None:
            self._copied.clear()
            with _COPYING_LOCK:
                _COPYING.add(self)
        self._thread = threading.Thread(
            target=self._run, args=(step, write, copy), name=f"hvdkit-ckpt-write-{step}", daemon=False
        )
        try:
            self._thread.start()
        except BaseException:
            self._copied.set()
            raise

    def _run(self, step, write, copy):
        try:
            if copy is not None:
                try:
                    copy()
                finally:  # whatever happened, nothing waits for the copy any more (a failure is the outcome)
                    self._copied.set()
                    with _COPYING_LOCK:
                        _COPYING.discard(self)
            _yield_to_training(self.priority)
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

    def join_locally(self) -> None:
        """Wait for this process's write thread, if one runs; its outcome is kept for the next ``settle``. No
        collective (a process that stops being rank 0 finishes its write before it gives back the lock)."""
        thread = self._thread
        if thread is not None and thread.is_alive():
            thread.join()

    def finish_locally(self, when: str = "at exit") -> None:
        """Rank 0, no collective (exit, close): wait for the write; log its failure, which no rank asked for.

        Only the process whose thread writes does anything: Horovod may be shut down by now (its own atexit
        handler, an in-process reset), so the communicator is not asked for the rank.
        """
        if self.step is None or self._thread is None:
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
