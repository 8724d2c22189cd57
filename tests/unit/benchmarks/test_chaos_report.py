"""The pure part of ``python -m benchmarks chaos``: the schedule, the check that every sample is used
once per epoch, recovery times, useful throughput, the table, and the --ways parser."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from benchmarks import chaos_report as report
from benchmarks.chaos import WAYS, parse_ways
from hvdkit.core.data import epoch_order
from hvdkit.core.errors import ConfigError

DIGITS = report.Schedule(1437, 64, 2)


def step_records(schedule, step, t, pids, size=None):
    """The records the ranks of one run of ``step`` write: ids split over ranks by slot, as the sampler does."""
    size = size or len(pids)
    ids = schedule.ids(step)
    epoch = schedule.where(step)[0]
    return [
        {"t": t + 0.001 * r, "pid": pid, "rank": r, "size": size, "epoch": epoch, "step": step, "ids": ids[r::size]}
        for r, pid in enumerate(pids)
    ]


def test_the_digits_schedule_has_23_steps_an_epoch_and_every_sample_once():
    assert DIGITS.steps_per_epoch == 23  # 22 of 64, then the last 29
    assert DIGITS.samples_through(23) == 1437 and DIGITS.samples_through(24) == 1437 + 64
    assert DIGITS.samples_through(22) == 22 * 64 and DIGITS.samples_through(0) == 0
    epoch1 = [i for s in range(24, 47) for i in DIGITS.ids(s)]
    assert sorted(epoch1) == list(range(1437))
    assert DIGITS.ids(24)[:64] == [int(v) for v in epoch_order(1437, 0, 1)[:64]]
    assert DIGITS.where(24) == (1, 0) and DIGITS.where(46) == (1, 22)


def test_a_run_with_faults_that_went_back_and_took_steps_again_passes_the_check():
    records, t = [], 0.0
    for step in range(1, 31):  # 2 ranks
        records += step_records(DIGITS, step, t := t + 1, [10, 11])
    records += step_records(DIGITS, 31, t := t + 1, [10])  # rank 1 killed before it logged step 31
    for step in range(21, 40):  # back to the commit at step 20, on 1 rank
        records += step_records(DIGITS, step, t := t + 1, [10])
    for step in range(40, 50):  # a new process joined
        records += step_records(DIGITS, step, t := t + 1, [10, 12])
    check = report.check_samples(records, DIGITS)
    assert check == {"ok": True, "steps": 49, "last_step": 49, "epochs_complete": 2, "problems": []}


def test_a_step_that_trained_on_a_wrong_sample_or_was_never_logged_fails_the_check_naming_it():
    records, t = [], 0.0
    for step in [*range(1, 5), *range(6, 30)]:
        records += step_records(DIGITS, step, t := t + 1, [10, 11])
    wrong = next(r for r in records if r["step"] == 3 and r["rank"] == 1)
    wrong["ids"][0] = records[0]["ids"][0]  # a sample of step 1 again
    check = report.check_samples(records, DIGITS)
    assert not check["ok"] and check["epochs_complete"] == 0
    assert check["problems"] == [
        "step 3: trained on 64 samples (0 repeated, 1 not of this step), the schedule has 64 (1 of them missing)",
        "steps never recorded: 5",
    ]


def test_a_last_run_whose_ranks_do_not_add_up_is_a_problem():
    records = step_records(DIGITS, 1, 1.0, [10, 11])[:1]  # size 2, only rank 0 logged
    check = report.check_samples(records, DIGITS)
    assert check["problems"] == ["step 1: its last run has ranks [0] at sizes [2]"]


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.tuples(st.integers(1, 12), st.sampled_from([1, 2]), st.integers(0, 8)), min_size=1, max_size=12),
    st.integers(0, 3),
    st.data(),
)
def test_any_sequence_of_rollbacks_and_world_sizes_passes_and_one_bad_sample_fails(segments, seed, data):
    schedule = report.Schedule(200, 16, 2, seed=seed)  # 13 steps an epoch, the last of 8
    records, t, step, pid = [], 0.0, 0, 100
    for length, size, back in segments:
        pid += 2  # each segment: a new world, back to a commit up to 8 steps behind
        step = max(0, step - back)
        for _ in range(length):
            step += 1
            records += step_records(schedule, step, t := t + 1, list(range(pid, pid + size)))
    reached = max(r["step"] for r in records)
    check = report.check_samples(records, schedule)
    assert check["ok"] and check["last_step"] == reached and check["epochs_complete"] == reached // 13
    last = report.last_runs(records)
    victim = data.draw(st.sampled_from(sorted(last)))
    last[victim][-1]["ids"] = last[victim][-1]["ids"][1:] or [999]
    assert not report.check_samples(records, schedule)["ok"]


def test_recovery_is_the_first_step_of_the_new_world_not_the_old_worlds_last():
    records, t = [], 0.0
    for step in range(1, 11):
        records += step_records(DIGITS, step, t := t + 1, [10, 11])
    killed_at = t + 0.0005  # between rank 0's and rank 1's record of step 10
    assert report.recovery(records, killed_at) is None  # rank 1's step 10 is the old world's
    records += step_records(DIGITS, 11, t + 0.3, [10, 11])[:1]  # the old world's rank 0 ends step 11
    assert report.recovery(records, killed_at) is None
    records += step_records(DIGITS, 6, t + 2.5, [10], size=1)  # back to step 5, on 1 rank
    assert report.recovery(records, killed_at) == {
        "at": t + 2.5,
        "step": 6,
        "reached": 10,
        "lost": 5,  # steps 6 to 10 again
        "seconds": pytest.approx(2.4995),
    }


def test_recovery_by_a_new_process_at_the_same_size_and_by_a_rollback_of_the_same_processes():
    records = step_records(DIGITS, 1, 1.0, [10, 11]) + step_records(DIGITS, 2, 2.0, [10, 11])
    relaunched = records + step_records(DIGITS, 2, 9.0, [20, 21])
    assert report.recovery(relaunched, 2.5)["seconds"] == pytest.approx(6.5)
    assert report.recovery(relaunched, 2.5)["lost"] == 1
    rolled_back = records + step_records(DIGITS, 2, 3.0, [10, 11])  # the same pids take step 2 again
    assert report.recovery(rolled_back, 2.5) == {"at": 3.0, "step": 2, "reached": 2, "lost": 1, "seconds": 0.5}
    assert report.recovery([], 1.0) is None


def test_percentiles_interpolate_between_ranks():
    assert report.percentile([4.0, 1.0, 3.0, 2.0], 50) == 2.5
    assert report.percentile([1.0, 2.0, 3.0, 4.0], 95) == pytest.approx(3.85)
    assert report.percentile([7.0], 95) == 7.0 and math.isnan(report.percentile([], 50))


def test_useful_throughput_counts_a_step_taken_again_once():
    schedule = report.Schedule(640, 64, 2)  # 10 steps of 64
    rows = [(0.5, 1), (1.5, 2), (2.5, 3), (3.5, 2), (4.5, 3), (5.5, 4)]  # steps 2 and 3 again after a fault
    records = [{"t": 100 + t, "step": s} for t, s in rows]
    series = report.useful_series(records, schedule, 100.0, 106.0, 2.0)
    assert series == [
        {"t": 2.0, "samples_per_s": 64.0},
        {"t": 4.0, "samples_per_s": 32.0},
        {"t": 6.0, "samples_per_s": 32.0},
    ]


def test_the_bins_of_a_window_read_on_todays_clock_end_at_its_end():
    t0 = 1_795_000_000.123456  # float arange lost the last bin of such a window
    assert [p["t"] for p in report.useful_series([], DIGITS, t0, t0 + 0.4 * 60, 4.0)] == [4.0 * i for i in range(1, 7)]
    series = report.useful_series([{"t": t0 + 9, "step": 1}], report.Schedule(640, 64, 2), t0, t0 + 10, 4.0)
    assert series == [
        {"t": 4.0, "samples_per_s": 0.0},
        {"t": 8.0, "samples_per_s": 0.0},
        {"t": 10.0, "samples_per_s": 32.0},
    ]


def _way(way, rate, faults=0, ok=True, median=None):
    return {
        "way": way,
        "useful_samples_per_s": rate,
        "faults": faults,
        "faults_recovered": faults,
        "recovery_s_median": median,
        "recovery_s_p95": median,
        "steps_lost_per_fault": 2.0 if faults else None,
        "samples": {"ok": ok, "epochs_complete": 7},
    }


def test_the_table_gives_each_way_against_the_fault_free_run():
    text = report.table({"ways": [_way("in-process", 760.0, 3, median=1.25), _way("none", 800.0)]})
    assert text.splitlines()[2:] == [
        "| in-process | 760.0 | 95.0 % | 3 (3) | 1.2 | 1.2 | 2.0 | yes (7 epochs) |",
        "| none | 800.0 | 100.0 % | 0 (0) | - | - | - | yes (7 epochs) |",
    ]
    alone = report.table({"ways": [_way("restart", 300.0, 1, ok=False, median=20.0)]})
    assert alone.splitlines()[2] == "| restart | 300.0 | - | 1 (1) | 20.0 | 20.0 | 2.0 | NO (7 epochs) |"


@given(
    st.lists(st.sampled_from(WAYS), unique=True, min_size=1),
    st.lists(st.floats(1, 1e5, allow_nan=False), min_size=3, max_size=3),
)
def test_the_table_has_a_row_per_way_in_order_with_as_many_cells_as_the_header(ways, rates):
    rows = report.table({"ways": [_way(w, r, 1, median=r) for w, r in zip(ways, rates, strict=False)]}).splitlines()
    assert len(rows) == 2 + len(ways)
    assert [r.split(" | ")[0].strip("| ") for r in rows[2:]] == list(ways)
    assert {r.count("|") for r in rows} == {9}


@given(st.lists(st.sampled_from(WAYS), unique=True, min_size=1))
def test_ways_parse_in_the_order_given(ways):
    assert parse_ways(",".join(ways)) == tuple(ways)
    assert parse_ways(" , ".join(ways)) == tuple(ways)


@given(st.text(min_size=1, max_size=12).filter(lambda w: w.strip() not in WAYS and "," not in w))
def test_an_unknown_or_repeated_way_is_a_config_error_naming_it(bad):
    with pytest.raises(ConfigError, match="unknown way") as e:
        parse_ways(f"restart,{bad}")
    assert repr(bad.strip()) in str(e.value)
    with pytest.raises(ConfigError, match="twice"):
        parse_ways("restart,none,restart")


def test_the_plot_is_written(tmp_path):
    way = dict(_way("restart", 300.0, 1), series=[{"t": 5.0, "samples_per_s": 300.0}], fault_times=[2.0])
    report.plot({"ways": [way], "bin_s": 5.0}, str(tmp_path / "chaos.png"))
    assert (tmp_path / "chaos.png").read_bytes()[:4] == b"\x89PNG"
    assert np.isfinite(way["useful_samples_per_s"])
