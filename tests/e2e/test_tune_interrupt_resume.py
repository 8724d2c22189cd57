"""`hvdkit tune --seed S` interrupted by SIGINT and run again resumes the study with new parameters: no
parameter set of the first run is drawn again (the sampler was seeded afresh with S on every run, so
the first new trial repeated trial 0). Trials are tests/e2e/scripts/tune_tiny_trial.py (no framework)."""

import csv
import os
import signal
import subprocess

import pytest
from helpers import HVDKIT, PYTHON, ROOT

pytestmark = pytest.mark.dist
optuna = pytest.importorskip("optuna")
TINY = "tests/e2e/scripts/tune_tiny_trial.py"


def _interrupt_after_first_complete(argv):
    proc = subprocess.Popen(
        argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    lines = []
    try:
        for line in proc.stdout:
            lines.append(line)
            if line.startswith("trial ") and " COMPLETE " in line:
                proc.send_signal(signal.SIGINT)
                break
        lines += proc.stdout.readlines()
        return proc.wait(timeout=120), "".join(lines)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def test_a_seeded_study_resumed_after_sigint_draws_no_parameter_set_again(tmp_path):
    space = tmp_path / "space.yaml"
    space.write_text("x: {type: float, low: 1.0, high: 2.0}\n")
    out = tmp_path / "o"
    argv = [HVDKIT, "tune", "--space", str(space), "--metric", "loss", "--mode", "min", "--out", str(out)]
    argv += ["--trials", "3", "--pruner", "none", "--seed", "0", "--", PYTHON, TINY, "--epochs", "2"]
    argv += ["--trial-dir", "{trial_dir}"]
    code, first = _interrupt_after_first_complete(argv)
    assert code == 130, first
    second = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert second.returncode == 0, second.stdout[-4000:] + second.stderr[-3000:]
    with open(out / "trials.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert sum(r["state"] == "COMPLETE" for r in rows) == 3
    # each parameter set has one key (its folder); an interrupted trial reruns under its own key
    keys_of = {}
    for r in rows:
        keys_of.setdefault(r["x"], set()).add(r["key"])
    assert all(len(keys) == 1 for keys in keys_of.values()), rows
    assert len(keys_of) == len({r["key"] for r in rows}) >= 3
