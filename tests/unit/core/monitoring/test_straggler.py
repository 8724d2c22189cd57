"""hvdkit.core.monitoring.straggler with a fake clock: exact step times, slowdowns and log lines."""

import logging
import math
import re

import pytest
from fake_clock import FakeClock

from hvdkit.core import ConfigError, LocalCommunicator, StragglerMonitor
from hvdkit.core.monitoring.straggler import RankTiming, build_report, straggler_threshold


class TwoRanks(LocalCommunicator):
    """Rank 0 of a pretend 2-rank job whose rank 1 recorded ``other`` (a RankTiming as dict)."""

    size = 2

    def __init__(self, other):
        self.other = other
        self.names = []

    def allgather_object(self, obj, name):
        self.names.append(name)
        return [obj, self.other]


@pytest.fixture
def records():
    """Every record the hvdkit.straggler logger emits (the hvdkit logger may not propagate)."""
    got = []
    handler = logging.Handler()
    handler.emit = got.append
    logger = logging.getLogger("hvdkit.straggler")
    logger.addHandler(handler)
    old_level = logger.level
    logger.setLevel(logging.DEBUG)
    yield got
    logger.removeHandler(handler)
    logger.setLevel(old_level)


def timed_steps(monitor, clock, durations, waits=()):
    for i, d in enumerate(durations):
        with monitor.step():
            clock.advance(d)
            if i < len(waits):
                with monitor.waiting():
                    clock.advance(waits[i])


def test_step_time_is_wall_time_minus_the_reported_waits():
    clock = FakeClock(start=100.0)
    m = StragglerMonitor(LocalCommunicator(), clock=clock, host="h0")
    timed_steps(m, clock, [0.010, 0.030, 0.020], waits=[0.5, 0.0, 0.25])
    m.step_begin()
    clock.advance(0.004)
    m.add_wait(0.001)
    assert m.step_end() == pytest.approx(0.003, abs=1e-12)
    t = m.local_timing()
    assert (t.rank, t.host, t.steps) == (0, "h0", 4)
    assert t.median_s == pytest.approx(0.015, abs=1e-12)  # median of 3, 10, 20, 30 ms
    assert t.mean_s == pytest.approx(0.063 / 4, abs=1e-12)


def test_a_wait_outside_a_step_is_ignored():
    clock = FakeClock(start=100.0)
    m = StragglerMonitor(LocalCommunicator(), clock=clock)
    m.add_wait(5.0)
    timed_steps(m, clock, [0.02])
    assert m.local_timing().median_s == pytest.approx(0.02, abs=1e-12)


def test_one_process_reports_its_median_and_no_straggler():
    clock = FakeClock(start=100.0)
    m = StragglerMonitor(LocalCommunicator(), threshold=1.5, clock=clock, host="solo")
    timed_steps(m, clock, [0.01, 0.03, 0.02])
    report = m.epoch_end(epoch=1)
    assert report.slowest_rank == 0 and report.slowdown == 1.0 and report.straggler is None
    assert report.ranks[0].median_s == pytest.approx(0.02, abs=1e-12)
    assert m.local_timing().steps == 0  # cleared for the next epoch


def test_rank0_warns_naming_the_slow_rank_its_host_and_slowdown(records):
    clock = FakeClock(start=100.0)
    other = {"rank": 1, "host": "node-b", "steps": 3, "median_s": 0.07, "mean_s": 0.07}
    comm = TwoRanks(other)
    m = StragglerMonitor(comm, threshold=1.5, name="train", clock=clock, host="node-a")
    timed_steps(m, clock, [0.02, 0.02, 0.02], waits=[0.05, 0.05, 0.05])  # waits excluded
    report = m.epoch_end(epoch=2)
    assert comm.names == ["hvdkit.straggler.train"]  # fixed by the monitor's name, not by values
    assert report.straggler == 1 and report.slowest.host == "node-b"
    assert report.slowdown == pytest.approx(3.5, rel=1e-9)  # 70 ms / 20 ms
    assert [r.levelno for r in records] == [logging.WARNING]
    msg = records[0].getMessage()
    assert "rank 1 (host node-b) is a straggler: 3.50x slower" in msg
    assert "70.0 ms vs 20.0 ms" in msg and "epoch 2" in msg and "threshold 1.5" in msg


def test_a_balanced_job_logs_info_and_names_no_straggler(records):
    clock = FakeClock(start=100.0)
    other = {"rank": 1, "host": "b", "steps": 3, "median_s": 0.021, "mean_s": 0.021}
    m = StragglerMonitor(TwoRanks(other), threshold=1.2, clock=clock, host="a")
    timed_steps(m, clock, [0.02, 0.02, 0.02])
    report = m.epoch_end()
    assert report.slowest_rank == 1 and not report.exceeded and report.straggler is None
    assert report.slowdown == pytest.approx(1.05, rel=1e-9)
    assert [r.levelno for r in records] == [logging.INFO]
    assert "within the threshold" in records[0].getMessage()


def test_slowdown_divides_by_the_median_of_the_other_ranks():
    medians = [0.010, 0.012, 0.011, 0.040, 0.013]
    timings = [RankTiming(r, f"h{r}", 10, m, m) for r, m in enumerate(medians)]
    report = build_report(timings, threshold=1.2)
    assert report.slowest_rank == 3
    assert report.slowdown == pytest.approx(0.040 / 0.0115, rel=1e-12)  # median of 10, 12, 11, 13 ms
    assert report.as_dict()["straggler"] == 3


def test_ranks_without_steps_are_left_out_and_ties_pick_the_lowest_rank():
    timings = [
        RankTiming(0, "a", 0, math.nan, math.nan),
        RankTiming(1, "b", 4, 0.02, 0.02),
        RankTiming(2, "c", 4, 0.02, 0.02),
    ]
    report = build_report(timings, threshold=1.2)
    assert (report.slowest_rank, report.slowdown) == (1, 1.0)
    empty = build_report([RankTiming(0, "a", 0, math.nan, math.nan)], threshold=1.2)
    assert empty.slowest_rank is None and "no rank timed a step" in empty.summary()


@pytest.mark.parametrize("bad", [1.0, 0.5, -2, math.inf, math.nan, "fast", True])
def test_a_threshold_that_is_not_a_finite_number_above_one_is_rejected_with_the_value(bad):
    with pytest.raises(ConfigError, match=rf"threshold must be a finite number > 1.0.*\(got {re.escape(repr(bad))}\)"):
        StragglerMonitor(LocalCommunicator(), threshold=bad)


def test_threshold_comes_from_the_argument_then_the_variable_then_the_default():
    env = {"HVDKIT_STRAGGLER_THRESHOLD": "1.7"}
    assert straggler_threshold(1.3, env) == 1.3
    assert straggler_threshold(None, env) == 1.7
    assert straggler_threshold(None, {}) == 1.2
    with pytest.raises(ConfigError, match=r"HVDKIT_STRAGGLER_THRESHOLD must be .*got 'x'"):
        straggler_threshold(None, {"HVDKIT_STRAGGLER_THRESHOLD": "x"})


def test_monitor_reads_the_threshold_variable(monkeypatch):
    monkeypatch.setenv("HVDKIT_STRAGGLER_THRESHOLD", "2.5")
    assert StragglerMonitor(LocalCommunicator()).threshold == 2.5


def test_step_end_without_step_begin_and_bad_step_times_are_clear_errors():
    m = StragglerMonitor(LocalCommunicator())
    with pytest.raises(ConfigError, match="without step_begin"):
        m.step_end()
    with pytest.raises(ConfigError, match=r"got -1"):
        m.record(-1)
    with pytest.raises(ConfigError, match=r"name must be a non-empty string"):
        StragglerMonitor(LocalCommunicator(), name="")
