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
