"""``python -m benchmarks synchronize-wait``'s report: the medians per way, each window over yield, the table."""

import statistics

from hypothesis import given
from hypothesis import strategies as st

from benchmarks import synchronize_wait as sw

KEYS = [key for key, _, _ in sw.MEASURES]


def _job(way, share, cpu, us, step):
    return {"way": way, "wait_main_thread_share": share, "wait_cpu_per_s": cpu, "allreduce_us": us, "step_ms": step}


def test_each_window_is_compared_with_the_engine_before_the_fix():
    jobs = [_job("yield", 0.99, 1.3, 300, 25.0), _job("poll 0 us", 0.0, 0.3, 310, 31.0)]
    jobs += [_job("poll 1000 us", 0.01, 0.32, 305, 26.0), _job("yield", 0.97, 1.2, 320, 27.0)]
    jobs += [_job("poll 0 us", 0.0, 0.31, 300, 30.0), _job("poll 1000 us", 0.0, 0.3, 300, 24.0)]
    table = sw.summarize(jobs)
    assert sw.ways_of(jobs) == ["yield", "poll 0 us", "poll 1000 us"]
    assert table["step_ms"]["yield"] == 26.0 and table["step_ms"]["poll 0 us"] == 30.5
    assert table["step_ms"]["over_yield"] == {"poll 0 us": 30.5 / 26.0, "poll 1000 us": 25.0 / 26.0}
    lines = sw.table_lines(table)
    assert lines[0] == (
        "| measure | yield (before) | poll 0 us (fix 80) | poll 1000 us (fix 80) | poll 0 us / yield | poll 1000 us / yield |"
    )
    assert lines[-1] == "| MLP step, median (rank 0) | 26.00 ms | 30.50 ms | 25.00 ms | 1.17x | 0.96x |"


VALUES = st.floats(0.001, 1e4, allow_nan=False)
JOB = st.tuples(st.sampled_from(["yield", "poll 50 us"]), VALUES, VALUES, VALUES, VALUES)


@given(st.lists(JOB, min_size=2, max_size=8).filter(lambda jobs: {j[0] for j in jobs} == {"yield", "poll 50 us"}))
def test_the_table_has_one_row_per_measure_with_each_ways_median_and_the_ratio(rows):
    jobs = [_job(*row) for row in rows]
    table = sw.summarize(jobs)
    lines = sw.table_lines(table)
    assert len(lines) == 2 + len(sw.MEASURES) and all(line.count("|") == 5 for line in lines)  # 4 columns
    for i, key in enumerate(KEYS, start=1):
        medians = {w: statistics.median(row[i] for row in rows if row[0] == w) for w in ("yield", "poll 50 us")}
        assert (table[key]["yield"], table[key]["poll 50 us"]) == (medians["yield"], medians["poll 50 us"])
        assert table[key]["over_yield"]["poll 50 us"] == medians["poll 50 us"] / medians["yield"]
