"""hold_stop_signals: a stop signal that comes between two PreemptionGuards (in-process recovery re-forming the
ring) is kept for the next guard instead of ending the process. Real signals to this process; size-1 communicator."""

import os
import signal
import time

from hvdkit.core import LocalCommunicator
from hvdkit.core.preemption import PreemptionGuard, hold_stop_signals


def _send_and_wait(sig, seen):
    """Send ``sig`` to this process and wait (at most 5 s) until ``seen()`` says its Python handler ran."""
    os.kill(os.getpid(), sig)
    deadline = time.monotonic() + 5
    while not seen():
        assert time.monotonic() < deadline, f"the handler of {sig!r} never ran"
        time.sleep(0.001)


def test_a_sigterm_between_two_guards_is_the_next_guards_and_it_stops_at_its_first_check():
    original = signal.getsignal(signal.SIGTERM)
    with hold_stop_signals():
        first = PreemptionGuard(LocalCommunicator())
        assert not first.should_stop()
        first.close()  # the training a lost worker ended
        handler = signal.getsignal(signal.SIGTERM)
        assert handler is not original and handler is not signal.SIG_DFL  # without the hold: the process ends here
        _send_and_wait(signal.SIGTERM, lambda: signal.getsignal(signal.SIGTERM) is handler and _held())
        after = PreemptionGuard(LocalCommunicator())  # the training that goes on
        assert after.received == signal.SIGTERM
        assert after.should_stop() and after.stopped  # at its first check, as if the signal had come just now
        after.close()
    assert signal.getsignal(signal.SIGTERM) is original


def test_a_signal_while_a_guard_is_installed_is_that_guards_alone():
    with hold_stop_signals():
        guard = PreemptionGuard(LocalCommunicator())
        _send_and_wait(signal.SIGUSR1, lambda: guard.received is not None)
        assert guard.should_stop() and guard.received == signal.SIGUSR1
        guard.close()
        later = PreemptionGuard(LocalCommunicator())
        assert later.received is None and not later.should_stop()
        later.close()


def test_a_signal_held_when_the_body_ends_is_dropped_and_the_previous_handlers_are_back():
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGUSR1)}
    with hold_stop_signals():
        _send_and_wait(signal.SIGUSR1, _held)  # the training was over: nothing to stop
    assert {sig: signal.getsignal(sig) for sig in before} == before
    guard = PreemptionGuard(LocalCommunicator())
    assert guard.received is None and not guard.should_stop()
    guard.close()


def _held():
    from hvdkit.core import preemption

    return bool(preemption._held)
