"""`hvdkit tune --max-failures F`: the search ends after F failed trials in a run (retries of one parameter set
included), exit code 1 with a message naming the limit and the last log, however many retries remain."""

import csv
import subprocess

import pytest
from helpers import HVDKIT, PYTHON, ROOT

pytestmark = pytest.mark.dist
optuna = pytest.importorskip("optuna")
ALWAYS_FAILS = ("-c", "import sys; print('tune_max_failures: exit 3', file=sys.stderr); sys.exit(3)")


def _tune(tmp_path, *flags):
    space = tmp_path / "space.yaml"
    space.write_text("lr: {type: float, low: 0.01, high: 0.1}\n")
    argv = [
        HVDKIT,
        "tune",
        "--space",
        str(space),
        "--metric",
        "val_loss",
        "--mode",
        "min",
        "--out",
        str(tmp_path / "o"),
    ]
    argv += ["--trials", "5", "--pruner", "none", *flags, "--", PYTHON, *ALWAYS_FAILS]
    return subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=300)


def test_the_search_ends_after_max_failures_failed_trials_though_retries_remain(tmp_path):
    proc = _tune(tmp_path, "--retries", "5", "--max-failures", "2")
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-2000:]
    with open(tmp_path / "o" / "trials.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert [(r["number"], r["state"], r["attempt"]) for r in rows] == [("0", "FAIL", "1"), ("1", "FAIL", "2")]
    assert all("tune_max_failures: exit 3" in r["error"] for r in rows)
    assert "search ended: 2 trials failed (--max-failures 2; last: trial 1, see " in proc.stdout
    assert "retrying its parameters (attempt 2 of 6)" in proc.stdout
    assert "attempt 3" not in proc.stdout  # no retry after the limit


def test_max_failures_below_one_is_refused_naming_the_flag(tmp_path):
    proc = _tune(tmp_path, "--max-failures", "0")
    assert proc.returncode != 0 and "--max-failures must be an integer >= 1 (got 0)" in proc.stderr
    assert not (tmp_path / "o" / "trials.csv").exists()
