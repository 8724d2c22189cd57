"""Preemption: turn SIGTERM (what SLURM and Kubernetes send) into a clean, collective stop."""

import signal
import threading

from .options import check_positive_int

__all__ = ["PreemptionGuard"]

DEFAULT_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)


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
    Collective: every rank calls ``should_stop()`` the same number of times.
    """

    def __init__(self, comm, every=1, signals=DEFAULT_SIGNALS):
        self.comm = comm
        self.every = check_positive_int("every", every, "1 checks at every call")
        self.received = None
        self.stopped = False
        self._calls = 0
        self._previous = {}
        if threading.current_thread() is threading.main_thread():
            for sig in signals:
                self._previous[sig] = signal.signal(sig, self._on_signal)

    def _on_signal(self, signum, _frame):
        self.received = signum

    def should_stop(self):
        """True on every rank once any rank received a stop signal (collective)."""
        self._calls += 1
        if self._calls % self.every:
            return False
        flag = 1.0 if self.received is not None else 0.0
        self.stopped = self.comm.allreduce_sum([flag], name="hvdkit.preemption")[0] > 0
        return self.stopped

    def close(self):
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous = {}

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
