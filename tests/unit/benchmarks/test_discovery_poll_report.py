"""``python -m benchmarks discovery-poll``: the medians per way, the table, and a real --quick run of both ways."""

import json
import subprocess
import sys

from helpers import ROOT
from hypothesis import given
from hypothesis import strategies as st

from benchmarks import discovery_poll as dp


def _rows(way, values):
    return [{"way": way, "run": i, "cpu_s": c, "wall_s": w} for i, (c, w) in enumerate(values)]


def test_the_medians_per_way_and_the_core_share_of_one_run_a_second():
    rows = _rows("middleman", [(0.21, 0.30), (0.25, 0.40), (0.19, 0.35)]) + _rows(
        "direct", [(0.004, 0.01), (0.002, 0.02)]
    )
    table = dp.summarize(rows)
    assert table["middleman"] == {"cpu_s": 0.21, "wall_s": 0.35, "core_share_at_1_per_s": 0.21}
    assert table["direct"]["cpu_s"] == 0.003 and table["direct"]["wall_s"] == 0.015
    assert table["direct_over_middleman_cpu"] == 0.003 / 0.21


@given(
    st.lists(st.tuples(st.floats(1e-4, 10.0), st.floats(1e-4, 10.0)), min_size=1, max_size=6),
    st.lists(st.tuples(st.floats(1e-4, 10.0), st.floats(1e-4, 10.0)), min_size=1, max_size=6),
)
def test_the_table_has_a_row_per_way_in_milliseconds_and_the_ratio(up, fix):
    table = dp.summarize(_rows("middleman", up) + _rows("direct", fix))
    lines = dp.table_lines(table)
    assert len(lines) == 2 + len(dp.WAYS) + 1
    for line, way in zip(lines[2:], dp.WAYS, strict=False):
        cells = [c.strip() for c in line.strip("|").split("|")]
        assert cells == [dp.LABELS[way], f"{table[way]['cpu_s'] * 1e3:.1f} ms", f"{table[way]['wall_s'] * 1e3:.1f} ms",
                         f"{100 * table[way]['cpu_s']:.1f} %"]  # fmt: skip
    assert lines[-1].split("|")[2].strip() == f"{table['direct']['cpu_s'] / table['middleman']['cpu_s']:.3f}x"


def test_a_quick_run_finds_the_hosts_both_ways_and_writes_its_files(tmp_path):
    done = subprocess.run([sys.executable, "-m", "benchmarks", "discovery-poll", "--out", str(tmp_path), "--quick"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads((tmp_path / "discovery-poll.json").read_text())
    assert sorted(r["way"] for r in result["runs"]) == ["direct"] * 3 + ["middleman"] * 3
    assert all(r["cpu_s"] >= 0 and r["wall_s"] > 0 for r in result["runs"])
    assert (tmp_path / "discovery-poll.png").stat().st_size > 0
    bad = subprocess.run([sys.executable, "-m", "benchmarks", "discovery-poll", "--out", "x", "--runs", "0"], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)  # fmt: skip
    assert bad.returncode == 2 and "--runs must be at least 1 (got 0)" in bad.stderr
