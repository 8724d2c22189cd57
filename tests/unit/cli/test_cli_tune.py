"""`hvdkit tune`'s command line: mistakes a user can make end before any trial starts, as one line on
stderr naming the fix and exit code 2."""

import os
import subprocess
import sys

import pytest
from helpers import ROOT

pytest.importorskip("optuna")


def _tune(tmp_path, *flags, command=("examples/torch_digits.py",)):
    space = tmp_path / "space.yaml"
    if not space.exists():
        space.write_text("lr: {type: float, low: 1.0e-3, high: 0.3, log: true}\n")
    argv = [sys.executable, "-m", "hvdkit", "tune", "--space", str(space), "--metric", "val_loss", "--mode", "min"]
    argv += ["--out", str(tmp_path / "out"), *flags, "--", sys.executable, *command]
    return subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=120)


def test_more_trials_times_ranks_than_cores_is_refused_before_anything_starts(tmp_path):
    cores = len(os.sched_getaffinity(0))
    proc = _tune(tmp_path, "--trials", "2", "--parallel", "2", "-np", str(cores))
    assert proc.returncode == 2
    assert (
        f"--parallel 2 trials x -np {cores} ranks need {2 * cores} cores, but this machine gives {cores}" in proc.stderr
    )
    assert f"use --parallel 1 with -np {cores}" in proc.stderr
    assert not (tmp_path / "out").exists()


def test_a_command_that_already_sets_a_searched_flag_is_refused(tmp_path):
    proc = _tune(tmp_path, "--trials", "1", command=("examples/torch_digits.py", "--lr", "0.1"))
    assert proc.returncode == 2 and "the command already has '--lr', which the search space sets" in proc.stderr


def test_a_bad_space_and_a_missing_script_are_one_line_errors(tmp_path):
    (tmp_path / "space.yaml").write_text("lr: {type: float, low: 0.3, high: 0.001}\n")
    proc = _tune(tmp_path, "--trials", "1")
    assert proc.returncode == 2
    assert proc.stderr.startswith("hvdkit tune: error: ") and "key 'lr': 'low' must be below 'high'" in proc.stderr
    proc = _tune(tmp_path, "--trials", "1", command=("no_such_script.py",))
    assert proc.returncode == 2 and "script 'no_such_script.py' not found" in proc.stderr
