"""``python -m benchmarks chaos --together``: the ways run at the same time (so they meet the same load), their
records come back in the order asked, and a way that fails stops the others at once and is the error raised.
The ways here are plain functions (the scheduling is the subject, not the jobs: tests/e2e/test_bench_chaos.py
runs real ones)."""

import threading
import time

import pytest

from benchmarks.chaos import WayAborted, parser, run_ways

WAYS = ("in-process", "restart", "none")


def test_together_every_way_runs_at_the_same_time_and_the_records_keep_the_order_asked():
    all_started = threading.Barrier(len(WAYS), timeout=10)  # broken (an error) unless all three run at once

    def run(way, abort):
        all_started.wait()
        time.sleep(0.05 if way == "in-process" else 0.0)  # the first way finishes last
        return {"way": way, "abort_given": abort is not None}

    assert run_ways(WAYS, run, together=True) == [{"way": w, "abort_given": True} for w in WAYS]


def test_one_after_the_other_each_way_starts_once_the_one_before_it_has_ended():
    running, seen = [], []

    def run(way, abort):
        assert abort is None and not running
        running.append(way)
        seen.append(way)
        time.sleep(0.01)
        running.remove(way)
        return {"way": way}

    assert [r["way"] for r in run_ways(WAYS, run)] == list(WAYS) == seen


def test_together_a_way_that_fails_stops_the_others_and_its_own_error_is_raised():
    stopped = []

    def run(way, abort):
        if way == "restart":
            time.sleep(0.1)
            raise RuntimeError("the restart job ended (exit code 1) before the end of its window")
        if not abort.wait(30):  # a way that trains out a long window unless told to stop
            return {"way": way}
        stopped.append(way)
        raise WayAborted(f"the {way} job was stopped: another way of this run failed")

    with pytest.raises(RuntimeError, match="restart job ended") as err:
        run_ways(WAYS, run, together=True)
    assert not isinstance(err.value, WayAborted)
    assert sorted(stopped) == ["in-process", "none"]  # told to stop, not trained out their 30 s


def test_together_is_off_unless_asked():
    assert parser().parse_args(["--minutes", "1", "--fault-every", "5"]).together is False
    assert parser().parse_args(["--minutes", "1", "--fault-every", "5", "--together"]).together is True
