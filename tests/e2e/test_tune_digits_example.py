"""examples/tune_digits.py under hvdkit tune, for real: a 2-rank trial whose metric is the one the script
reports itself (val_error), next to the epoch metrics hvdkit's Trainer reports (val_accuracy); the
study's value is the last epoch's val_error, and it equals 1 - val_accuracy of the same epoch. The same
trial through the Ray backend (a local Ray: the trial a placement group of 2 CPUs) gives the same."""

import csv
import importlib.util
import json
import subprocess

import pytest
from helpers import HVDKIT, PYTHON, ROOT

pytestmark = pytest.mark.dist
pytest.importorskip("optuna")


NO_RAY = pytest.mark.skipif(importlib.util.find_spec("ray") is None, reason="needs Ray: pip install 'hvdkit[ray]'")


@pytest.mark.parametrize("backend", ["local", pytest.param("ray", marks=NO_RAY)])
def test_tune_digits_reports_val_error_each_epoch_and_it_is_the_trials_value(tmp_path, backend):
    space = tmp_path / "space.yaml"
    space.write_text("momentum: {type: float, low: 0.5, high: 0.9}\n")
    out = tmp_path / "study"
    argv = [HVDKIT, "tune", "--space", str(space), "--metric", "val_error", "--mode", "min", "--trials", "1"]
    argv += ["--backend", backend, "-np", "2", "--pruner", "none", "--seed", "0", "--out", str(out), "--", PYTHON]
    argv += ["examples/tune_digits.py", "--epochs", "2", "--lr", "0.1", "--checkpoint-dir", "{trial_dir}/ckpt"]
    proc = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-3000:]
    # one attempt's files (named by the Optuna trial on the local backend, by the attempt on Ray)
    (report_file,) = (out / "trials" / "0000").glob("reports-*.jsonl")
    reports = [json.loads(x) for x in report_file.read_text().splitlines()]
    epochs = {}
    for r in reports:  # the Trainer's line and the script's line of each epoch
        epochs.setdefault(r["epoch"], {}).update(r["metrics"])
    assert sorted(epochs) == [0, 1]
    for m in epochs.values():
        assert m["val_error"] == pytest.approx(1.0 - m["val_accuracy"], abs=1e-12)
    (row,) = list(csv.DictReader((out / "trials.csv").read_text().splitlines()))
    assert row["state"] == "COMPLETE" and float(row["value"]) == pytest.approx(epochs[1]["val_error"], abs=1e-12)
    assert 0.5 <= float(row["momentum"]) <= 0.9
    (log_file,) = (out / "trials" / "0000").glob("attempt-*.log")
    log = log_file.read_text()
    assert "epoch 2/2:" in log and " lr 0.1 (" in log  # the command's flags reached the script, on 2 ranks
    assert "[rank 1/2]" in log or "world size 2" in log
    assert epochs[1]["val_accuracy"] > 0.5  # it learned (chance is 0.1; seeded, so the same value every run)
