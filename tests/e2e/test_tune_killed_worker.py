"""An `hvdkit tune` worker killed with SIGKILL mid-trial cannot end its trial, which stays RUNNING in the
study (and other workers count it as taken). Running the same command again on the same host finds
the trial's worker and job gone, records it FAIL, runs its parameters again in the same trial folder,
and finishes exactly --trials."""

import csv
import os
import signal
import subprocess
import time

import pytest
from helpers import HVDKIT, PYTHON, ROOT
from tune_jobs import wait_group_gone

pytestmark = pytest.mark.dist
optuna = pytest.importorskip("optuna")


def _processes_with(text):
    """Pids of processes whose environment holds ``text`` (a trial's report path is under --out)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                if text.encode() in f.read():
                    found.append(int(pid))
        except OSError:
            pass
    return found


def test_a_rerun_requeues_the_trial_of_a_worker_killed_with_sigkill(tmp_path):
    from hvdkit.tune.storage import open_storage
    from hvdkit.tune.workers import JOB_ATTR, WORKER_ATTR

    space = tmp_path / "space.yaml"
    space.write_text("lr: {type: float, low: 0.03, high: 0.3, log: true}\n")
    out = tmp_path / "o"
    argv = [HVDKIT, "tune", "--space", str(space), "--metric", "val_loss", "--mode", "min", "--out", str(out)]
    argv += ["--trials", "2", "--pruner", "none", "--seed", "3", "--", PYTHON, "examples/torch_digits.py"]
    argv += ["--epochs", "1", "--compression", "none", "--checkpoint-dir", "{trial_dir}/ck"]
    proc = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        for line in proc.stdout:
            if line.startswith("trial 0 started"):
                break
        study = optuna.load_study(storage=open_storage(None, str(out)), study_name="hvdkit-tune")
        deadline = time.monotonic() + 30
        while JOB_ATTR not in study.get_trials()[0].user_attrs and time.monotonic() < deadline:
            time.sleep(0.05)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    first = study.get_trials()[0]
    assert first.state.name == "RUNNING" and first.user_attrs[WORKER_ATTR].endswith(f":{proc.pid}")
    job = first.user_attrs[JOB_ATTR]
    os.killpg(job, signal.SIGKILL)  # the trial's hvdkit run outlives its worker: end it (it is this test's)
    wait_group_gone(job)
    assert _processes_with(str(out)) == []  # its ranks were in its group
    again = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stdout[-4000:] + again.stderr[-3000:]
    worker = first.user_attrs[WORKER_ATTR]
    assert again.stdout.splitlines()[0] == (
        f"trial 0 was RUNNING in worker {worker}, which is gone: recorded FAIL, parameters queued"
    )
    with open(out / "trials.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert [r["state"] for r in rows] == ["FAIL", "COMPLETE", "COMPLETE"]
    rerun = next(r for r in rows[1:] if r["key"] == "0")  # trial 0's parameters, run again in its folder
    assert rerun["lr"] == rows[0]["lr"] and rerun["attempt"] == "1"
    assert _processes_with(str(out)) == []
