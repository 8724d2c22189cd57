"""A trial that another `hvdkit tune` worker ended while it ran here (that worker judged this one gone,
recorded the trial FAIL and queued its parameters again) is one clear line in this worker's output,
not Optuna's UpdateFinishedTrialError traceback: this worker drops the trial and goes on; its
parameters run again and the study finishes."""

import csv
import subprocess

import pytest
from helpers import HVDKIT, PYTHON, ROOT

pytestmark = pytest.mark.dist
optuna = pytest.importorskip("optuna")


def test_a_trial_taken_over_by_another_worker_is_one_line_and_the_search_goes_on(tmp_path):
    space = tmp_path / "space.yaml"
    space.write_text("x: {type: float, low: 1.0, high: 2.0}\n")
    out, journal = tmp_path / "o", tmp_path / "study.journal"
    argv = [HVDKIT, "tune", "--space", str(space), "--metric", "loss", "--mode", "min", "--out", str(out)]
    argv += ["--storage", str(journal), "--trials", "1", "--pruner", "none", "--seed", "0", "--", PYTHON]
    argv += ["tests/e2e/scripts/tune_taken_over.py", "--journal", str(journal), "--trial-dir", "{trial_dir}"]
    proc = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=300)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-4000:]
    assert "Traceback" not in output and "UpdateFinishedTrialError" not in output
    (line,) = [x for x in proc.stdout.splitlines() if x.startswith("trial 0: ")]
    assert line.startswith("trial 0: another hvdkit tune worker on this study recorded it FAIL while it ran here")
    with open(out / "trials.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert [(r["number"], r["state"], r["key"]) for r in rows] == [("0", "FAIL", "0"), ("1", "COMPLETE", "0")]
    assert rows[1]["x"] == rows[0]["x"] and float(rows[1]["value"]) == float(rows[0]["x"])
