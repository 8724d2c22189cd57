"""Faults injected into real 2-rank jobs started by `hvdkit run`: what the user gets afterwards.

Each test is bounded in time (a hang fails it) and checks that no rank process is left behind.
"""

import os
import pathlib
import shutil
import signal
import subprocess
import time

import numpy as np
import pytest
from helpers import (
    BIN,
    HVDKIT,
    PYTHON,
    ROOT,
    fixed_compression,  # noqa: F401 - autouse: HVDKIT_COMPRESSION=fp16 for this module's runs
    hvdkit_run,
    record_figures,
    result_line,
)

from hvdkit.core.checkpoint.state import read_newest

pytestmark = pytest.mark.dist
TORCH = "examples/torch_digits.py"
KERAS = "examples/keras_digits.py"
KILL_ONCE = "tests/e2e/scripts/kill_once.py"
SKIP = "tests/e2e/scripts/skip_collective.py"
PACED = "tests/e2e/scripts/paced.py"
STEPS_PER_EPOCH = 23  # 1,437 training samples, 2 ranks, batch 32


def newest(ckpt_dir):
    """The newest checkpoint that verifies, read through the public reader (no file layout here)."""
    return read_newest(ckpt_dir)


def torch_params(ckpt_dir):
    return newest(ckpt_dir).state["model"]  # arrays by state-dict key


def keras_params(ckpt_dir):
    return dict(enumerate(newest(ckpt_dir).state["model"]))  # arrays in model.weights order


def assert_bitwise_equal(a, b):
    assert sorted(a) == sorted(b)
    for key in a:
        assert a[key].dtype == b[key].dtype and np.array_equal(a[key], b[key]), key


def leftovers(marker):
    out = subprocess.run(["pgrep", "-f", marker], capture_output=True, text=True).stdout.split()
    return [pid for pid in out if int(pid) != os.getpid()]


@pytest.fixture(scope="module")
def uninterrupted(torch_demo, keras_demo):
    """Uninterrupted 12-epoch runs of the torch and Keras examples: the references, the session's runs
    (tests/e2e/conftest.py: read only). The torch one ran with fp16 as this module's runs do; a run compared with
    the Keras one pins the compression that run's "auto" chose (``compression``)."""
    return {
        "torch": {"dir": torch_demo.ckpt, "result": torch_demo.result, "seconds": torch_demo.seconds},
        "keras": {
            "dir": keras_demo.ckpt,
            "result": keras_demo.result,
            "seconds": keras_demo.seconds,
            "compression": keras_demo.result["compression"],
        },
    }


# Keras only: the torch Trainer's SIGKILL-and-restart is tests/distributed/test_trainer_torch.py's (rank 0 killed,
# the same launcher lines, the history carried over), at a third of this one's cost (2 epochs, not 12).
@pytest.mark.parametrize("framework, script, params", [("keras", KERAS, keras_params)])
def test_sigkill_of_rank1_mid_epoch_restarts_and_ends_bitwise_equal_to_an_uninterrupted_run(
    uninterrupted, tmp_path, framework, script, params, monkeypatch
):
    monkeypatch.setenv("HVDKIT_COMPRESSION", uninterrupted[framework]["compression"])  # what the reference ran with
    d = tmp_path / "ckpt"
    # step 100 lies in epoch 5 (steps 93-115): the newest checkpoint then is the end of epoch 4
    t0 = time.monotonic()
    proc = hvdkit_run(
        "-np", "2", "--max-restarts", "1", "--", PYTHON, KILL_ONCE, "100", script, "--checkpoint-dir", str(d)
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "rank 1 was killed by SIGKILL" in proc.stderr and "restarting (1/1)" in proc.stderr
    assert "job finished after 1 restart used" in proc.stderr
    r = result_line(proc.stdout)
    assert r["resumed_from_epoch"] == 4 and r["steps"] == 12 * STEPS_PER_EPOCH
    assert_bitwise_equal(params(d), params(uninterrupted[framework]["dir"]))
    assert (r["val_loss"], r["val_accuracy"]) == (
        uninterrupted[framework]["result"]["val_loss"],
        uninterrupted[framework]["result"]["val_accuracy"],
    )
    assert leftovers("kill_once.py") == []
    record_figures(
        f"sigkill_rank1_{framework}",
        seconds=round(time.monotonic() - t0, 1),
        uninterrupted_seconds=round(uninterrupted[framework]["seconds"], 1),
        # torch dies entering step 100 (93-99 done), Keras after batch 100: both redo them from step 92
        steps_redone=(99 if framework == "torch" else 100) - 4 * STEPS_PER_EPOCH,
    )


def test_a_rank_that_skips_a_collective_ends_the_job_naming_it_and_leaves_nothing_behind():
    t0 = time.monotonic()
    proc = hvdkit_run("-np", "2", "--stall-timeout", "10", "--", PYTHON, SKIP, timeout=60)
    assert proc.returncode != 0
    assert "rank 1 stopped taking part in collectives" in proc.stderr
    assert "1!: [allreduce.hvdkit.test.skipped_by_rank1]" in proc.stderr  # Horovod's own evidence
    seconds = time.monotonic() - t0
    assert seconds < 60
    assert leftovers("skip_collective.py") == []
    record_figures("rank_skips_collective", stall_timeout=10, seconds_to_job_end=round(seconds, 1))


def test_sigterm_mid_epoch_saves_the_current_step_and_the_next_start_continues_exactly(uninterrupted, tmp_path):
    d = tmp_path / "ckpt"
    # paced (20 ms a step): the 12-epoch run outlasts the signal on any machine, and its maths stay unpaced
    argv = [HVDKIT, "run", "-np", "2", "--", PYTHON, PACED, "0.02", TORCH, "--checkpoint-dir", str(d)]
    env = dict(os.environ, PATH=f"{BIN}{os.pathsep}{os.environ['PATH']}")
    proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while not (d.exists() and any(p.startswith("ckpt-000000000069") for p in os.listdir(d))):  # the store's names
            assert time.monotonic() < deadline and proc.poll() is None, "the job never reached epoch 3"
            time.sleep(0.05)
        time.sleep(0.3)  # well inside a later epoch
        proc.send_signal(signal.SIGTERM)  # what SLURM and Kubernetes send
        signalled = time.monotonic()
        out, err = proc.communicate(timeout=60)
        stop_seconds = time.monotonic() - signalled
    finally:
        proc.kill()
    assert proc.returncode == 128 + signal.SIGTERM, err[-3000:]
    assert "stopped by SIGTERM" in err and "every rank exited cleanly" in err
    stopped = result_line(out)
    assert stopped["preempted"] is True
    step = stopped["steps"]
    assert 69 < step < 12 * STEPS_PER_EPOCH  # stopped mid-run, after the checkpoint it waited for
    assert newest(d).step == step  # a checkpoint of the very step it stopped at
    # The next start continues from that batch and ends where the uninterrupted run (the module's reference) ends.
    again = hvdkit_run("-np", "2", "--", PYTHON, TORCH, "--checkpoint-dir", str(d))
    assert again.returncode == 0, again.stderr[-3000:]
    resumed = result_line(again.stdout)
    assert resumed["resumed_from_epoch"] == step // STEPS_PER_EPOCH
    assert resumed["steps"] == uninterrupted["torch"]["result"]["steps"] == 12 * STEPS_PER_EPOCH
    assert_bitwise_equal(torch_params(d), torch_params(uninterrupted["torch"]["dir"]))
    record_figures(
        "sigterm_mid_epoch", seconds_to_clean_exit=round(stop_seconds, 2), stopped_at_step=step, steps_lost=0
    )


def test_flipped_bytes_in_the_newest_checkpoint_make_resume_fall_back_and_say_so(uninterrupted, tmp_path):
    d = tmp_path / "ckpt"
    shutil.copytree(uninterrupted["torch"]["dir"], d)
    largest = max(
        pathlib.Path(newest(d).path).iterdir(), key=lambda p: p.stat().st_size
    )  # the tensors, whatever the layout
    data = bytearray(largest.read_bytes())
    data[len(data) // 2] ^= 0xFF
    largest.write_bytes(bytes(data))
    proc = hvdkit_run("-np", "2", "--", PYTHON, TORCH, "--checkpoint-dir", str(d))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "ckpt-000000000276" in proc.stderr and "SHA-256" in proc.stderr
    assert "after skipping 1 newer checkpoint(s)" in proc.stderr
    r = result_line(proc.stdout)
    assert r["resumed_from_epoch"] == 11  # fell back one epoch, retrained it ...
    assert_bitwise_equal(torch_params(d), torch_params(uninterrupted["torch"]["dir"]))  # ... to the same model
    record_figures("flipped_bytes_newest_checkpoint", epochs_redone=1, steps_redone=STEPS_PER_EPOCH)


def test_resuming_with_another_world_size_reshards_and_continues(tmp_path):
    d = tmp_path / "ckpt"
    first = hvdkit_run("-np", "2", "--", PYTHON, TORCH, "--epochs", "3", "--checkpoint-dir", str(d))
    assert first.returncode == 0
    one = hvdkit_run("-np", "1", "--", PYTHON, TORCH, "--epochs", "4", "--checkpoint-dir", str(d))
    assert one.returncode == 0, one.stderr[-3000:]
    assert "checkpoint was written by 2 ranks, this job has 1" in one.stderr
    r = result_line(one.stdout)
    assert (r["world_size"], r["resumed_from_epoch"]) == (1, 3)
    assert r["steps"] == 3 * STEPS_PER_EPOCH + 45  # one rank takes all 1,437 samples: 45 batches
