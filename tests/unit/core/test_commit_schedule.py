"""hvdkit.core.recovery.CommitSchedule, which steps commit under in-process recovery (the torch Trainer's and
Keras's hk.elastic.fit): a fixed number of steps, or "auto" from a step's and a commit's measured time. A clock of
the test's own, a size-1 communicator (and one that stands in for a second rank); real ranks:
tests/e2e/test_in_process_recovery*.py."""

import logging

import pytest

from hvdkit.core import LocalCommunicator
from hvdkit.core.errors import ConfigError
from hvdkit.core.recovery import AUTO_MOST, AUTO_PROBE, CommitSchedule, check_commit_every


class Clock:
    """Seconds that pass only when the test says so."""

    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


class OtherRankWants(LocalCommunicator):
    """A rank 0 whose one peer asks for ``wanted`` in every allgather (the schedule's interval, 0: undecided)."""

    size = 2

    def __init__(self, wanted):
        self.wanted = wanted

    def allgather_object(self, obj, name):
        assert name == "hvdkit.elastic.every"  # fixed, whatever the value
        return [obj, self.wanted]


def train(schedule, clock, steps, step_s, commit_s):
    """``steps`` steps of ``step_s`` seconds, each committed (``commit_s`` seconds) when the schedule says so;
    the 1-based numbers of the steps that committed."""
    committed = []

    def commit():
        clock.now += commit_s

    for i in range(1, steps + 1):
        clock.now += step_s
        if schedule.due():
            schedule.commit(commit)
            committed.append(i)
    return committed


def test_a_number_of_steps_commits_every_nth_step_counted_from_the_last_restart():
    clock = Clock()
    schedule = CommitSchedule(5, LocalCommunicator(), clock)
    assert train(schedule, clock, 12, 0.01, 0.0009) == [5, 10]
    schedule.restart()  # a recovery at step 12: the count starts there
    assert train(schedule, clock, 7, 0.01, 0.0009) == [5]
    assert schedule.every == 5


def test_auto_commits_every_probed_step_then_the_fewest_that_cost_at_most_two_percent_and_rank_0_logs_it(caplog):
    clock = Clock()
    schedule = CommitSchedule("auto", LocalCommunicator(), clock)
    with caplog.at_level(logging.INFO, logger="hvdkit.elastic"):
        # a commit of 0.9 ms against steps of 10 ms (the commit left out of the step): 2 % of 10 ms is 0.2 ms, so
        # one commit in 5 steps; AUTO_PROBE step times need one step more than that
        committed = train(schedule, clock, AUTO_PROBE + 1 + 12, 0.010, 0.0009)
    assert committed == [*range(1, AUTO_PROBE + 2), AUTO_PROBE + 1 + 5, AUTO_PROBE + 1 + 10]
    assert schedule.every == 5
    (said,) = [r.getMessage() for r in caplog.records if "committing every" in r.getMessage()]
    assert "a commit takes 0.9 ms, a step 10.0 ms: committing every 5 step(s) (at most 2% of the time" in said


def test_auto_commits_at_least_once_every_step_and_at_most_every_auto_most_steps():
    for commit_s, every in [(0.0, 1), (0.999, 500), (100.0, AUTO_MOST)]:  # against steps of 100 ms
        clock = Clock()
        schedule = CommitSchedule("auto", LocalCommunicator(), clock)
        train(schedule, clock, AUTO_PROBE + 1, 0.1, commit_s)
        assert schedule.every == every, commit_s


def test_the_ranks_agree_on_the_largest_interval_and_a_restart_keeps_the_one_decided():
    clock = Clock()
    schedule = CommitSchedule("auto", OtherRankWants(12), clock)
    train(schedule, clock, AUTO_PROBE + 1, 0.010, 0.0009)  # this rank alone would take 5
    assert schedule.every == 12
    schedule.restart()  # a new worker that has decided nothing (0) takes it too
    assert schedule.every == 12 and train(schedule, clock, 12, 0.010, 0.0009) == [12]


def test_a_new_worker_takes_the_interval_the_others_decided_and_none_decided_means_probing_anew():
    clock = Clock()
    joined = CommitSchedule("auto", OtherRankWants(7), clock)
    joined.restart()
    assert joined.every == 7 and train(joined, clock, 7, 0.01, 0.0009) == [7]
    clock = Clock()
    fresh = CommitSchedule("auto", OtherRankWants(0), clock)
    train(fresh, clock, 3, 0.01, 0.0009)
    fresh.restart()  # a recovery during the probe: every step commits again, from a probe of its own
    assert fresh.every is None and train(fresh, clock, AUTO_PROBE + 1, 0.01, 0.0009) == list(range(1, AUTO_PROBE + 2))
    assert fresh.every == 5


def test_the_communicator_may_be_a_function_called_when_the_ranks_agree():
    calls = []

    def communicator():
        calls.append(1)
        return LocalCommunicator()

    clock = Clock()
    schedule = CommitSchedule("auto", communicator, clock)
    assert calls == []  # nothing collective at construction: a joining worker builds it before the sync
    train(schedule, clock, AUTO_PROBE + 1, 0.01, 0.0009)
    assert calls == [1] and schedule.every == 5


@pytest.mark.parametrize("bad", [0, -3, 2.5, True, "Auto", "10", None])
def test_a_commit_every_that_is_neither_auto_nor_a_count_is_refused_naming_it_and_the_fix(bad):
    with pytest.raises(ConfigError) as e:
        check_commit_every(bad)
    assert f"commit_every must be an integer >= 1 (got {bad!r})" in str(e.value)
    assert "pass 'auto'" in str(e.value) and "a number of optimizer steps" in str(e.value)
    with pytest.raises(ConfigError):
        CommitSchedule(bad, LocalCommunicator())
    assert check_commit_every("auto") == "auto" and check_commit_every(3) == 3
