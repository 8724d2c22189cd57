"""hvdkit tune on the digits example, for real: trials are `hvdkit run` jobs, two at once on the two
cores; a trial that fails is retried with the same parameters; a study interrupted by SIGINT resumes
when the same command runs again, until N trials are done; a bad trial is pruned through the
preemption path (its two ranks checkpoint and exit) and recorded PRUNED."""

import csv
import json
import os
import subprocess

import pytest
from helpers import HVDKIT, PYTHON, ROOT
from tune_jobs import interrupt_after_complete

pytestmark = pytest.mark.dist
optuna = pytest.importorskip("optuna")


def _argv(out, space, *flags, command):
    head = [HVDKIT, "tune", "--space", str(space), "--metric", "val_loss", "--mode", "min", "--out", str(out)]
    return head + [*flags, "--", PYTHON, *command]


def _trial_processes(out):
    """Pids of processes still running with this study's report folder in their environment."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                if str(out).encode() in f.read():
                    found.append(int(pid))
        except OSError:
            pass
    return found


def _rows(out):
    with open(out / "trials.csv", newline="") as f:
        return list(csv.DictReader(f))


def _most_at_once(out):
    """The most trials of the study in OUT that were running at one moment (from their start and end)."""
    from hvdkit.tune.storage import open_storage

    trials = optuna.load_study(study_name="hvdkit-tune", storage=open_storage(None, str(out))).get_trials()
    edges = sorted(
        [(t.datetime_start, 1) for t in trials if t.datetime_start and t.datetime_complete]
        + [(t.datetime_complete, -1) for t in trials if t.datetime_start and t.datetime_complete]
    )
    running = most = 0
    for _, step in edges:  # an end sorts before a start at the same instant
        running += step
        most = max(most, running)
    return most


def test_two_trials_at_once_a_failed_one_retried_and_an_interrupted_study_resumed(tmp_path):
    space = tmp_path / "space.yaml"
    space.write_text("lr: {type: float, low: 0.03, high: 0.3, log: true}\n")
    out = tmp_path / "study"
    command = [
        "tests/e2e/scripts/tune_fail_once.py",
        str(tmp_path / "failed-once"),
        "examples/torch_digits.py",
        "--epochs",
        "2",
        "--compression",
        "none",
        "--checkpoint-dir",
        "{trial_dir}/ckpt",
    ]
    flags = ("--trials", "3", "--parallel", "2", "-np", "1", "--retries", "1", "--pruner", "none", "--seed", "0")
    argv = _argv(out, space, *flags, command=command)
    code, first = interrupt_after_complete(argv, 2)
    assert code == 130, first
    assert "interrupted by SIGINT: run the same command again to resume" in first
    assert _trial_processes(out) == []  # every trial's hvdkit run and ranks ended
    done_first = sum(r["state"] == "COMPLETE" for r in _rows(out))
    assert done_first == 2, first
    second = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert second.returncode == 0, second.stdout[-4000:] + second.stderr[-3000:]
    assert f"{done_first} of 3 trials done" in second.stdout.splitlines()[0]
    rows = _rows(out)
    complete = [r for r in rows if r["state"] == "COMPLETE"]
    assert len(complete) == 3
    # the injected failure: recorded with its output, retried (attempt 2) with the same lr in the same folder
    (failed,) = [r for r in rows if "injected failure" in r["error"]]
    assert failed["state"] == "FAIL" and failed["error"].startswith("exit code ")
    (retry,) = [r for r in rows if r["key"] == failed["key"] and r["attempt"] == "2"]
    assert retry["state"] == "COMPLETE" and retry["lr"] == failed["lr"]
    # an interrupted trial is run again with its parameters (a new trial, same key and folder)
    for r in rows:
        if "interrupted by SIGINT" in r["error"]:
            again = [x for x in complete if x["key"] == r["key"] and int(x["number"]) > int(r["number"])]
            assert again and again[0]["lr"] == r["lr"]
    best = json.loads((out / "best.json").read_text())
    assert best["value"] == min(float(r["value"]) for r in complete)
    assert best["params"]["lr"] == float(next(r["lr"] for r in complete if int(r["number"]) == best["number"]))
    assert (out / "history.png").read_bytes()[:4] == b"\x89PNG"
    assert "state  seconds" in second.stdout and second.stdout.count("COMPLETE") >= 3
    # --parallel 2: two trials ran at the same time (read from the study, not a wall-clock bound)
    assert _most_at_once(out) == 2


def test_a_bad_trial_is_pruned_gracefully_on_both_of_its_ranks(tmp_path):
    space = tmp_path / "space.yaml"
    space.write_text("lr: {type: categorical, choices: [0.1, 0.00001]}\n")
    out = tmp_path / "pruned"
    # 20 short epochs (batch 64): the pruner decides at epoch 0, and the stop reaches the ranks well before the end
    command = ["examples/torch_digits.py", "--epochs", "20", "--batch-size", "64", "--compression", "none"]
    command += ["--checkpoint-dir", "{trial_dir}/ckpt"]
    # seed 10: the sampler tries lr 0.1 first, then 1e-05 (asserted below)
    flags = ("--trials", "2", "--parallel", "1", "-np", "2", "--pruner", "median", "--pruner-startup-trials", "1")
    argv = _argv(out, space, *flags, "--seed", "10", command=command)
    proc = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-3000:]
    rows = _rows(out)
    assert [(r["number"], r["lr"], r["state"]) for r in rows] == [("0", "0.1", "COMPLETE"), ("1", "1e-05", "PRUNED")]
    assert "trial 1 PRUNED at epoch 0" in proc.stdout
    log = (out / "trials" / "0001" / "attempt-0001.log").read_text()
    assert "hvdkit run: stopped by SIGTERM: every rank exited cleanly" in log, log[-3000:]
    assert log.count("checkpoint saved") == 1 and "stopped in epoch" in log  # rank 0 saved the step it stopped at
    reports = (out / "trials" / "0001" / "reports-0001.jsonl").read_text().splitlines()
    assert 1 <= len(reports) < 20  # stopped, not finished
    assert _trial_processes(out) == []
