"""Horovod's own ``hvd.elastic.run`` (engine fix 17-elastic-worker-lost-while-ring-forms-fails-init): a reset whose
``hvd.init()`` failed because a worker was lost while the ring formed (HorovodInternalError) is tried again, at most
``RESET_ATTEMPTS`` times in a row, then the run stops with a RuntimeError that says so. Before the fix that error
escaped the loop at the first failed reset (and, before fix 17's C++ part, the process aborted inside Gloo).
Pure logic of the loop (``run_fn(func, reset)`` with an ``ObjectState`` on one process, no rendezvous): ``reset`` is
the step that would shut Horovod down and start it again, here a function that fails a given number of times; the
failed init itself is tested with real ranks in tests/e2e/test_in_process_recovery.py."""

import pytest
from horovod.common import elastic
from horovod.common.exceptions import HorovodInternalError


def job(reset_failures):
    """A run whose first call of the function loses a worker; its reset fails ``reset_failures`` times."""
    calls, resets = [], []

    def reset():
        resets.append(len(resets) + 1)
        if len(resets) <= reset_failures:
            raise HorovodInternalError(f"ring not formed, try {len(resets)}")

    def train(state):
        calls.append(state.step)
        if len(calls) == 1:
            state.step = 99  # not committed: the recovery goes back to step 3
            raise HorovodInternalError("a worker was lost")
        return state.step

    state = elastic.ObjectState(bcast_object=lambda obj: obj, get_rank=lambda: 0, step=3)
    return elastic.run_fn(train, reset), state, calls, resets


def test_a_reset_that_fails_twice_is_tried_again_and_training_goes_on_from_the_commit():
    run, state, calls, resets = job(2)
    assert run(state) == 3
    assert calls == [3, 3] and resets == [1, 2, 3]


def test_a_reset_that_keeps_failing_stops_the_run_after_the_bound_with_a_message():
    run, state, calls, resets = job(100)
    with pytest.raises(RuntimeError, match=r"failed 5 times in a row.*giving up: ring not formed, try 5") as caught:
        run(state)
    assert resets == [1, 2, 3, 4, 5] and elastic.RESET_ATTEMPTS == 5 and calls == [3]
    assert isinstance(caught.value.__cause__, HorovodInternalError)
