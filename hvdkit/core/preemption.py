"""Preemption: turn SIGTERM (what SLURM and Kubernetes send) into a clean, collective stop."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import threading
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any, Self

from . import env as _env
from .options import check_int_at_least, check_positive_int

if TYPE_CHECKING:
    from .comm import Communicator

__all__ = ["PreemptionGuard", "hold_stop_signals", "report_to_launcher"]

DEFAULT_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)
REPORT_MARK = "hvdkit-rank"  # the mark of the reports hvdkit.launcher.rankwrap writes (the launcher reads both)
_held: list[int] = []  # stop signals caught by hold_stop_signals while no guard was installed, for the next guard


def _hold(signum, _frame):
    _held.append(signum)


@contextlib.contextmanager
def hold_stop_signals(signals: Iterable[signal.Signals] = DEFAULT_SIGNALS) -> Iterator[None]:
    """While the body runs, a stop signal that comes when no ``PreemptionGuard`` is installed is kept for the
    next guard made, which then stops at its first check, instead of ending the process at once.

    In-process recovery (``hk.elastic.run``) needs it: between the guard of the training that a lost worker
    ended and the guard of the training that goes on (the ring forming again, the state synced), SIGTERM's
    default action killed the process, and with it the progress since the last checkpoint. A guard installs
    its own handler over this one and puts it back when closed, so a signal while a guard is installed goes
    to that guard as before. A signal held when the body ends (the training was over) is dropped.
    Main thread only (elsewhere the body runs without it, as a guard made there has no handler either)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {sig: signal.signal(sig, _hold) for sig in signals}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        _held.clear()


def report_to_launcher(record: dict[str, Any]) -> None:
    """Tell ``hvdkit run`` ``record`` (a JSON object) on one line of stderr, which it takes out of the
    output; nothing outside ``hvdkit run``. Call it on rank 0 only (a ``"worker"`` record: on every rank).
    Env: HVDKIT_JOB_ID (set by ``hvdkit run``)."""
    job = os.environ.get(_env.JOB_ID, "")
    if job:
        try:  # one write: never interleaved with other output on the same pipe
            os.write(2, f"{REPORT_MARK} {job} {json.dumps(record)}\n".encode())
        except OSError:
            pass


class PreemptionGuard:
    """Notices SIGTERM/SIGUSR1 on any rank; ``should_stop()`` tells every rank at the same step.

        guard = PreemptionGuard(comm)
        for batch in loader:
            train_step(batch)
            if guard.should_stop():          # collective: one tiny allreduce
                ckpt.save(step, epoch, ...)  # rank 0 writes the current step
                break

    Signals reach ranks at slightly different times; deciding through an allreduce of the flag
    makes every rank stop after the same step, so the checkpoint is consistent. ``every`` checks
    only every n-th call (the other calls return False without communicating). Handlers are
    installed on creation (main thread only) and the previous ones restored by ``close()``.

    ``should_stop(step=N)``, N the steps done so far, also tells ``hvdkit run`` where training is:
    rank 0 writes ``hvdkit-rank JOB {"event": "step", "step": N}`` to its stderr (the launcher takes
    these lines out of the output), so an elastic job's summary can say which step each attempt
    resumed at (the first N minus 1) and how many steps a relaunch recomputed. The first call
    reports even without ``step`` (``"step": null``): from then on every rank has its guard, so an
    elastic launcher may ask the ranks to stop without killing them mid-start-up. A loop that checks
    the guard seldom (Keras: at epoch ends) says where it is in between with ``progress(step)``,
    and where it resumed with ``progress(step, resumed=True)`` (neither is collective). The call
    that first returns True reports ``"stopping": true``: the ranks stop because asked, so an
    elastic launcher relaunches them; ranks that end without it have finished.
    Collective: every rank calls ``should_stop()`` the same number of times.
    Env: HVDKIT_JOB_ID (set by ``hvdkit run``; without it no step is reported).
    """

    def __init__(self, comm: Communicator, every: int = 1, signals: Iterable[signal.Signals] = DEFAULT_SIGNALS) -> None:
        self.comm = comm
        self.every = check_positive_int("every", every, "1 checks at every call")
        self.received = None
        self.stopped = False
        self._wants_stop = False
        self._calls = 0
        self._previous = {}
        if threading.current_thread() is threading.main_thread():
            for sig in signals:
                self._previous[sig] = signal.signal(sig, self._on_signal)
            if _held:  # a stop signal came while no guard was installed (hold_stop_signals): it is this guard's
                self.received = _held[0]
                _held.clear()
        if os.environ.get(_env.RECOVERY) == "in-process":
            # Horovod's elastic workers have no rank wrapper to say where they run: each says it here (every rank,
            # each time it enters training), so that a stop sent to `hvdkit run` reaches one on another host
            report_to_launcher({"event": "worker", "pid": os.getpid(), "host": socket.gethostname()})

    def _on_signal(self, signum, _frame):
        self.received = signum

    def should_stop(self, step: int | None = None, also: bool = False) -> bool:
        """True on every rank once any rank received a stop signal, or asked with ``also`` (collective).

        ``step`` (optional, the steps done so far) is reported to ``hvdkit run`` by rank 0.
        ``also``: this rank wants to stop too (its own reason: a callback's ``stop_training``, a
        step limit), decided in the same allreduce; a request made at a call that does not check
        (``every``) counts at the next check. Only a signal makes the ranks report that they stop
        because asked (an elastic launcher relaunches them); a stop of their own is a finish.
        """
        if step is not None or self._calls == 0:  # the first call says the ranks train (and can stop cleanly)
            self._report(step)
        self._calls += 1
        self._wants_stop = self._wants_stop or bool(also)
        if self._calls % self.every:
            return False
        flags = [1.0 if self.received is not None else 0.0, 1.0 if self._wants_stop else 0.0]
        signalled, wanted = self.comm.allreduce_sum(flags, name="hvdkit.preemption")
        if signalled > 0 and not self.stopped:  # the launcher tells "stopped as asked" from "finished" by it
            self._report(step, stopping=True)
        self.stopped = signalled > 0
        return self.stopped or wanted > 0

    def progress(self, step: int, resumed: bool = False) -> None:
        """Tell ``hvdkit run`` (from rank 0) that ``step`` steps are done; ``resumed``: training
        resumes after step ``step`` (0 for a fresh start). Not collective: any rank may call it as
        often as it likes, only rank 0 reports."""
        self._report(
            check_int_at_least(
                "step", step, 0, "pass the number of optimizer steps done, e.g. int(optimizer.iterations)"
            ),
            resumed,
        )

    def _report(self, step, resumed=False, stopping=False):
        if getattr(self.comm, "rank", 0) != 0:
            return
        record = {"event": "step", "step": None if step is None else int(step)}
        if resumed:
            record["resumed"] = True
        if stopping:
            record["stopping"] = True
        report_to_launcher(record)

    def close(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous = {}

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
