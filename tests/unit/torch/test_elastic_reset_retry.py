"""hk.elastic.run's reset after a lost worker or a join: a worker lost while the ring forms again fails that
``hvd.init()`` with HorovodInternalError (engine fix 17); the loop tries again, a bounded number of times, and then
stops with a message that says what happened and what to do. Pure logic: ``restart`` is the step that would shut
Horovod down and start it again, here a function that fails a given number of times."""

import pytest
from horovod.common.exceptions import HorovodInternalError

from hvdkit.core import recovery
from hvdkit.core.errors import CollectiveError
from hvdkit.torch import elastic


def failing(times):
    calls = []

    def restart():
        calls.append(len(calls) + 1)
        if len(calls) <= times:
            raise HorovodInternalError(f"ring not formed, try {len(calls)}")

    return restart, calls


def test_a_reset_that_fails_twice_is_tried_again_and_the_recovery_counts_the_failed_tries():
    state = elastic.State(None, step=3)
    state.recoveries.append({"cause": "workers join", "from_size": 1})
    restart, calls = failing(2)
    elastic._reset(restart, HorovodInternalError, state)
    assert calls == [1, 2, 3]
    assert state.recoveries[-1]["failed_resets"] == 2


def test_a_reset_that_keeps_failing_stops_after_the_bound_naming_the_cause_and_what_to_do():
    state = elastic.State(None)
    restart, calls = failing(100)
    with pytest.raises(CollectiveError) as caught:
        elastic._reset(restart, HorovodInternalError, state)
    assert calls == list(range(1, recovery.RESET_ATTEMPTS + 1)) and recovery.RESET_ATTEMPTS == 5
    message = str(caught.value)
    assert "could not be formed again 5 times in a row" in message and "ring not formed, try 5" in message
    assert "start it again (it resumes from its newest checkpoint)" in message
    assert isinstance(caught.value.__cause__, HorovodInternalError)


def test_any_other_error_of_the_reset_is_not_taken_for_a_lost_worker():
    restart, calls = failing(0)

    def broken():
        restart()
        raise ValueError("Horovod has not been built with Gloo")

    with pytest.raises(ValueError, match="built with Gloo"):
        elastic._reset(broken, HorovodInternalError, elastic.State(None))
    assert calls == [1]
