"""hvdkit tune --backend ray, for real, on a local Ray that hvdkit tune starts on the 2 cores: two trials
at once, each an `hvdkit run -np 1` job whose reports reach Ray Tune; one fails once and Ray retries it
in its own folder; the worse trial is stopped by Ray's
MedianStoppingRule through the preemption path (its rank gets the stop, 'checkpoints' and exits); the
local backend's results; and no Ray or trial process outlives the command."""

import csv
import json
import os
import subprocess
import threading
import time

import pytest
from helpers import PYTHON, ROOT

pytestmark = pytest.mark.dist
pytest.importorskip("optuna")
pytest.importorskip("ray.tune")

MARK = "HVDKIT_TEST_RAY_STUDY"  # set for hvdkit tune only: every process it starts (Ray's too) inherits it
EPOCHS = 30


def _marked(value):
    """Pids of the processes whose environment has MARK=value (what this test's hvdkit tune started)."""
    needle = f"{MARK}={value}".encode()
    found = set()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                if needle in f.read().split(b"\0"):
                    found.add(int(pid))
        except OSError:
            pass
    return found


def _names(pids):
    out = {}
    for pid in pids:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                out[pid] = f.read().replace(b"\0", b" ").decode(errors="replace")[:400]
        except OSError:
            pass
    return out


def test_ray_backend_runs_two_trials_at_once_retries_a_failed_one_and_stops_the_worse_one_gracefully(tmp_path):
    space = tmp_path / "space.yaml"
    space.write_text("x: {type: categorical, choices: [1, 8]}\n")
    out = tmp_path / "study"
    # the tiny trial reports loss = x every 0.15 * x s: x=1 finishes 30 epochs in 4.5 s, x=8 would take 36 s,
    # so Ray's median rule sees the better trial ahead and stops the worse one (seed 0 samples both values)
    # DeprecationWarnings are errors in hvdkit tune's process (its calls of Ray, Optuna and itself)
    argv = [PYTHON, "-W", "error::DeprecationWarning", "-m", "hvdkit", "tune", "--backend", "ray"]
    argv += ["--space", str(space), "--metric", "loss", "--mode", "min", "--trials", "2", "--parallel", "2"]
    argv += ["-np", "1", "--pruner", "median", "--pruner-startup-trials", "1", "--retries", "1", "--seed", "0"]
    # the first trial to start fails at once (tune_fail_once.py); Ray retries it (max_failures) in its folder
    argv += ["--out", str(out), "--", PYTHON, "tests/e2e/scripts/tune_fail_once.py", str(tmp_path / "failed-once")]
    argv += ["tests/e2e/scripts/tune_tiny_trial.py", "--epochs", str(EPOCHS), "--trial-dir", "{trial_dir}"]
    env = dict(os.environ, **{MARK: str(tmp_path)})
    proc = subprocess.Popen(
        argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    seen, done = {}, threading.Event()

    def watch():  # every process of the run, while it runs: Ray's daemons, its workers, the trials
        while not done.is_set():
            seen.update(_names(_marked(tmp_path)))  # re-read: between fork and exec a child shows its parent
            time.sleep(0.5)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    t0 = time.monotonic()
    try:
        text, _ = proc.communicate(timeout=300)  # Ray's start takes 10-40 s on 2 loaded cores
    finally:
        done.set()
        watcher.join()
        if proc.poll() is None:
            os.killpg(proc.pid, 9)
            proc.wait()
    took = time.monotonic() - t0
    assert proc.returncode == 0, text[-5000:]
    assert "on a local Ray (2 CPUs): 2 trials, up to 2 at once" in text

    with open(out / "trials.csv", newline="") as f:
        rows = {r["x"]: r for r in csv.DictReader(f)}
    assert set(rows) == {"1", "8"}, rows
    good, bad = rows["1"], rows["8"]
    assert (good["state"], float(good["value"])) == ("COMPLETE", 1.0)
    assert (bad["state"], float(bad["value"])) == ("PRUNED", 8.0)  # a pruned trial's last reported value
    best = json.loads((out / "best.json").read_text())
    assert (best["value"], best["params"], best["metric"], best["mode"]) == (1.0, {"x": 1}, "loss", "min")
    assert (out / "history.png").read_bytes()[:4] == b"\x89PNG"
    assert "state  seconds" in text and f"trial {bad['key']} PRUNED at epoch" in text

    good_dir, bad_dir = (out / "trials" / f"{int(r['key']):04d}" for r in (good, bad))
    # the injected failure: one trial's first attempt, retried by Ray with the same x in the same folder
    (failed,) = [r for r in (good, bad) if r["attempt"] == "2"]
    failed_dir = out / "trials" / f"{int(failed['key']):04d}"
    assert "injected failure" in (failed_dir / "attempt-0001.log").read_text()
    assert (failed_dir / "attempt-0002.log").exists() and not (failed_dir / "reports-0001.jsonl").exists()
    assert f"trial {failed['key']} failed: retrying it (attempt 2 of 2)" in text
    assert sorted(p.name for p in failed_dir.glob("attempt-*")) == ["attempt-0001.log", "attempt-0002.log"]
    # the other trial ran once: no pause and resume (Ray's median rule would pause it while the retry waits)
    other_dir = bad_dir if failed_dir == good_dir else good_dir
    assert sorted(p.name for p in other_dir.glob("attempt-*")) == ["attempt-0001.log"]
    # every epoch of the complete trial was reported, relayed to Ray Tune and kept in its results
    assert len(sorted(good_dir.glob("reports-*.jsonl"))[-1].read_text().splitlines()) == EPOCHS
    assert (good_dir / "done.rank0").read_text() == f"epoch {EPOCHS - 1}\n"
    ray_results = [json.loads(line) for p in (out / "ray").rglob("result.json") for line in p.read_text().splitlines()]
    relayed = [r for r in ray_results if r.get("hvdkit_key") == int(good["key"])]
    assert sorted({r["epoch"] for r in relayed}) == list(range(EPOCHS)) and all(r["loss"] == 1.0 for r in relayed)
    # its last result says how the job ended (the last epoch again when the job exited after it was relayed)
    assert (relayed[-1]["epoch"], relayed[-1]["hvdkit_exit"], relayed[-1]["done"]) == (EPOCHS - 1, 0, True)
    # the stopped trial: its rank got the stop, wrote its 'checkpoint' and exited; hvdkit run says so
    stopped_at = int((bad_dir / "stopped.rank0").read_text().split()[1])
    assert 1 <= stopped_at < EPOCHS and not (bad_dir / "done.rank0").exists()
    log = sorted(bad_dir.glob("attempt-*.log"))[-1].read_text()
    assert "hvdkit run: stopped by SIGTERM: every rank exited cleanly" in log, log[-3000:]

    # Ray's processes (gcs_server, raylet, its workers) and the trials' were seen, and none is left
    names = seen
    assert any("raylet" in c for c in names.values()) and any("gcs_server" in c for c in names.values()), names
    assert any("tune_tiny_trial.py" in c for c in names.values()), names
    left = _names(_marked(tmp_path))
    assert left == {}, left
    assert took < 280, took
