"""``python -m benchmarks controller-wait``'s report: per-job idle totals, the medians per way, the table."""

import subprocess
import sys

from helpers import ROOT
from hypothesis import given
from hypothesis import strategies as st

from benchmarks import controller_wait as cw

KEYS = ("idle_cpu_per_s", "idle_cpu_per_s_rank1", "allreduce_us", "allreduce_cpu_per_s", "step_ms")


def _job(way, r0, r1, us, step):
    return cw.with_idle_totals(
        {"way": way, "idle_cpu_per_s": r0, "idle_cpu_per_s_rank1": r1, "allreduce_us": us, "allreduce_cpu_per_s": 1.0,
         "step_ms": step}
    )  # fmt: skip


def test_the_idle_cpu_counts_both_ranks_and_the_busier_whichever_rank_polled():
    jobs = [_job("spin", 0.98, 0.1, 280, 20.0), _job("spin", 0.1, 0.96, 300, 24.0), _job("spin", 0.5, 0.6, 290, 22.0)]
    jobs += [
        _job("sleep", 0.2, 0.3, 270, 17.0),
        _job("sleep", 0.15, 0.25, 290, 18.0),
        _job("sleep", 0.2, 0.2, 280, 19.0),
    ]
    table = cw.summarize(jobs)
    assert table["idle_cpu_per_s_both"]["spin"] == 1.08  # medians of 1.08, 1.06, 1.1
    assert round(table["idle_cpu_per_s_busier"]["spin"], 3) == 0.96  # of 0.98, 0.96, 0.6: rank 0 alone would say 0.5
    assert table["allreduce_us"] == {"spin": 290, "sleep": 280, "sleep_over_spin": 280 / 290}
    assert table["step_ms"]["sleep_over_spin"] == 18.0 / 22.0


@given(
    st.lists(st.tuples(*[st.floats(0.001, 1e4, allow_nan=False)] * 4), min_size=1, max_size=5),
    st.lists(st.tuples(*[st.floats(0.001, 1e4, allow_nan=False)] * 4), min_size=1, max_size=5),
)
def test_the_table_has_one_row_per_measure_with_each_ways_median_and_their_ratio(spins, sleeps):
    jobs = [_job("spin", *v) for v in spins] + [_job("sleep", *v) for v in sleeps]
    table = cw.summarize(jobs)
    lines = cw.table_lines(table)
    assert lines[0].startswith("| measure | spin (before) | sleep (fix 20) |") and len(lines) == 2 + len(cw.MEASURES)
    for line, (key, label, fmt) in zip(lines[2:], cw.MEASURES, strict=True):
        cells = [c.strip() for c in line.strip("|").split("|")]
        assert cells == [label, fmt.format(table[key]["spin"]), fmt.format(table[key]["sleep"]),
                         f"{table[key]['sleep'] / table[key]['spin']:.2f}x"]  # fmt: skip


def test_the_lab_runs_it_by_its_dashed_name_and_refuses_no_reps():
    helped = subprocess.run([sys.executable, "-m", "benchmarks", "controller-wait", "--help"], cwd=ROOT,
                            capture_output=True, text=True, timeout=120)  # fmt: skip
    assert helped.returncode == 0 and "--reps" in helped.stdout, helped.stderr
    bad = subprocess.run([sys.executable, "-m", "benchmarks", "controller-wait", "--out", "x", "--reps", "0"], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)  # fmt: skip
    assert bad.returncode == 2 and "--reps must be at least 1 (got 0)" in bad.stderr
