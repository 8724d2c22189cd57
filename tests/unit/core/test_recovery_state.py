"""hvdkit.core.recovery.CommittedState, the part of both hk.elastic.State classes that is not the framework's: the
keyword values, the commit counter, and the decision to act on the driver's host notices. Size-1 communicator; the
join case of tests/e2e/test_in_process_recovery.py checks the same decision on real ranks."""

import pytest

from hvdkit.core import LocalCommunicator
from hvdkit.core.errors import ConfigError
from hvdkit.core.recovery import CommittedState

NO_UPDATE, ADDED, REMOVED = 0, 1, 2  # Horovod's HostUpdateResult values


class Counting(CommittedState):
    def __init__(self, **values):
        super().__init__(values=values)
        self.saved, self.checked = 0, 0

    def save(self):
        self.saved += 1
        self._saved({"values": dict(self.values)})

    def check_host_updates(self):
        self.checked += 1


def test_values_are_attributes_and_one_that_would_hide_a_method_is_refused_naming_it():
    state = Counting(epoch=2, step=7)
    assert (state.epoch, state.step, state.values) == (2, 7, {"epoch": 2, "step": 7})
    with pytest.raises(ConfigError, match="'commit'"):
        Counting(commit=1)
    with pytest.raises(ConfigError, match="'_hidden'"):
        Counting(_hidden=1)


def test_commit_every_commits_at_every_nth_step_and_a_commit_saves_then_checks_the_hosts():
    state = Counting(step=0)
    done = [state.commit_every(3) for _ in range(7)]
    assert done == [False, False, True, False, False, True, False]
    assert (state.saved, state.checked) == (2, 2)
    assert state._commit["id"] == 2
    state.commit()  # a commit out of turn starts the count again
    assert [state.commit_every(3) for _ in range(3)] == [False, False, True]


def test_a_host_notice_is_acted_on_once_and_says_whether_it_only_removed_hosts():
    state, comm = Counting(), LocalCommunicator()
    assert state._host_update(comm, NO_UPDATE, REMOVED) is None  # nothing heard
    state.on_hosts_updated(10.0, REMOVED)
    assert state._host_update(comm, NO_UPDATE, REMOVED) is True
    assert state._host_update(comm, NO_UPDATE, REMOVED) is None  # acted on: not again
    state.on_hosts_updated(11.0, ADDED)
    state.on_hosts_updated(12.0, REMOVED)
    assert state._host_update(comm, NO_UPDATE, REMOVED) is False  # added and removed: not removals only


def test_a_notice_no_newer_than_the_last_one_acted_on_is_ignored_and_a_reset_forgets_the_old_rings_notices():
    state, comm = Counting(), LocalCommunicator()
    state.on_hosts_updated(20.0, ADDED)
    assert state._host_update(comm, NO_UPDATE, REMOVED) is False
    state.on_hosts_updated(20.0, ADDED)  # the same notice again (as a joining worker may hear it)
    state.on_hosts_updated(5.0, REMOVED)
    assert state._host_update(comm, NO_UPDATE, REMOVED) is None
    state.on_hosts_updated(30.0, ADDED)
    state.on_reset()
    assert state._host_update(comm, NO_UPDATE, REMOVED) is None


# ---------------------------------------------------------------- recover_in_process: hk.elastic.run's loop
class Lost(RuntimeError):
    """What a failed collective raises (Horovod's HorovodInternalError in the adapters)."""


class Joins(RuntimeError):
    """Horovod's HostsUpdatedInterrupt in the adapters."""


class Syncing(Counting):
    def __init__(self, **values):
        super().__init__(**values)
        self.events = []

    def sync(self):
        self.events.append("sync")

    def restore(self):
        self.events.append("restore")


def loop(state, attempts):
    """``recover_in_process`` over ``attempts`` (each raises its exception or returns its value), recording each
    step of the loop in ``state.events``."""
    from hvdkit.core.recovery import recover_in_process

    todo = list(attempts)

    def attempt():
        state.events.append("train")
        outcome = todo.pop(0)
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome

    return recover_in_process(
        attempt,
        state,
        joins=Joins,
        is_lost=lambda e: isinstance(e, Lost),
        begin=lambda cause, error: state.events.append((cause, None if error is None else str(error))),
        reset=lambda: state.events.append("reset"),
        recovered=lambda: state.events.append("recovered"),
    )


def test_a_lost_worker_goes_back_to_the_commit_a_join_does_not_and_each_trains_again_after_a_reset():
    state = Syncing()
    assert loop(state, [Lost("ring broken"), Joins(), "done"]) == "done"
    once = ["sync", "recovered", "train"]
    assert state.events == [
        *once, ("a worker was lost", "ring broken"), "restore", "reset",
        *once, ("workers join", None), "reset",
        *once,
    ]  # fmt: skip


def test_any_other_error_of_the_training_ends_the_loop_as_it_is():
    state = Syncing()
    with pytest.raises(ValueError, match="a bug of the script"):
        loop(state, [ValueError("a bug of the script")])
    assert state.events == ["sync", "recovered", "train"]


def test_a_sigterm_in_a_reset_is_held_and_the_default_handler_is_back_after_the_loop():
    import os
    import signal
    import time

    from hvdkit.core import preemption

    state = Syncing()
    before = signal.getsignal(signal.SIGTERM)
    seen = []

    def attempt():
        state.events.append("train")
        if len(seen) == 0:
            os.kill(os.getpid(), signal.SIGTERM)  # no guard installed: without the hold the process ends here
            deadline = time.monotonic() + 5
            while not preemption._held and time.monotonic() < deadline:
                time.sleep(0.001)
            seen.append(list(preemption._held))
            raise Lost("then a worker is lost")
        return "went on"

    from hvdkit.core.recovery import recover_in_process

    got = recover_in_process(
        attempt, state, joins=Joins, is_lost=lambda e: isinstance(e, Lost), begin=lambda c, e: None,
        reset=lambda: None, recovered=lambda: None,
    )  # fmt: skip
    assert got == "went on" and seen == [[signal.SIGTERM]]
    assert signal.getsignal(signal.SIGTERM) is before and preemption._held == []


# ---------------------------------------------------------------- who says it became rank 0
def test_the_process_that_becomes_rank_0_says_how_and_no_other_process_says_anything():
    from hvdkit.core.recovery import rank0_takeover

    assert rank0_takeover(0, 1, joined=False) == "was rank 1"  # a survivor: rank 0 was lost
    assert rank0_takeover(0, 3, joined=True) == "was rank 3"  # a worker that joined earlier, now moved down to 0
    assert rank0_takeover(0, None, joined=True) == "a worker that joined"  # its first sync, given rank 0
    assert rank0_takeover(0, None, joined=False) is None  # the job's start: rank 0 from the first
    assert rank0_takeover(0, 0, joined=False) is None  # rank 0 before and after a recovery
    assert rank0_takeover(1, 0, joined=False) is None  # rank 0 moved up to 1: the new rank 0 says it
    assert rank0_takeover(1, None, joined=True) is None


def test_a_worker_that_joins_and_is_given_rank_0_says_so_at_its_first_sync_and_not_again():
    """Horovod's elastic driver gives ranks host by host, the first hosts assigned first: a new worker in a slot of
    the first host (whose process died) takes rank 0 ahead of the running workers of the hosts after it. Before,
    only a process with a previous rank other than 0 said it took over, so this one said nothing."""
    from hvdkit.core.recovery import RankWatch

    joined = RankWatch()  # no on_start: its first sync took another rank's commit
    assert [joined.after_sync(r) for r in (0, 0, 1, 0)] == ["a worker that joined", None, None, "was rank 1"]
    started = RankWatch()
    started.started()  # the job's start ran on_start here
    assert [started.after_sync(r) for r in (0, 1, 0)] == [None, None, "was rank 1"]
    survivor = RankWatch()
    survivor.started()
    assert [survivor.after_sync(r) for r in (1, 0, 0)] == [None, "was rank 1", None]
