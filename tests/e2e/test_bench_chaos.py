"""``python -m benchmarks chaos``, short: a real 2-rank Trainer job whose ranks get SIGKILLs, and the
facts it records (faults injected and recovered from, every sample once per epoch, the JSON fields).
The in-process way (``--recovery in-process``: the survivor goes back to its last in-memory commit and a
new worker joins), the one the soak is about; the restart way shares all of the benchmark's code but
``argv_of``.

Untimed: the recovery times and throughput it records are never asserted.
"""

import json

import pytest
from helpers import PYTHON, ROOT, run_bounded

pytestmark = pytest.mark.dist

FIELDS = {
    "way",
    "load_1min",
    "window_s",
    "steps_reached",
    "steps_run",
    "useful_samples",
    "useful_samples_per_s",
    "faults",
    "faults_recovered",
    "recovery_s_median",
    "recovery_s_p95",
    "steps_lost_per_fault",
    "samples",
    "argv",
    "exit_code",
    "series",
    "fault_times",
    "fault_list",
}


def test_a_short_soak_kills_ranks_recovers_and_trains_every_sample_once_per_epoch(tmp_path):
    out = tmp_path / "chaos"
    argv = [PYTHON, "-m", "benchmarks", "chaos", "--minutes", "0.4", "--fault-every", "6", "--ways", "in-process"]
    proc = run_bounded([*argv, "--out", str(out), "--bin", "4"], timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    way = json.loads((out / "in-process.json").read_text())
    assert set(way) == FIELDS
    assert way["way"] == "in-process" and way["exit_code"] == 0 and way["window_s"] == 24.0
    low, high = way["load_1min"]  # the machine's load while the way ran, lowest and highest
    assert 0 <= low <= high
    assert way["faults"] >= 1 and way["faults_recovered"] == way["faults"]
    for fault in way["fault_list"]:
        assert fault["rank"] in (0, 1) and fault["killed_s"] >= fault["due_s"] >= 6.0
        assert fault["recovered_s"] > 0 and fault["resumed_step"] == fault["reached"] - fault["lost"] + 1
        assert fault["lost"] <= 5  # back to the last in-memory commit (every 5 steps), not to a checkpoint (20)
    assert len({f["pid"] for f in way["fault_list"]}) == way["faults"]  # each kill hit a live rank once
    assert way["fault_times"] == [f["killed_s"] for f in way["fault_list"]]
    check = way["samples"]
    assert check["ok"], check["problems"]
    assert check["last_step"] >= way["steps_reached"] >= 1
    assert check["epochs_complete"] == check["last_step"] // 23  # the digits: 23 steps of 64 an epoch
    assert way["steps_run"] >= way["steps_reached"]  # steps computed again after a kill are counted, not useful
    assert [p["t"] for p in way["series"]] == [4.0 * i for i in range(1, 7)]
    summary = json.loads((out / "summary.json").read_text())
    assert [w["way"] for w in summary["ways"]] == ["in-process"] and summary["fault_every_s"] == 6.0
    assert summary["together"] is False
    assert (out / "table.md").read_text().splitlines()[2].startswith("| in-process | ")
    assert (out / "chaos.png").read_bytes()[:4] == b"\x89PNG"
