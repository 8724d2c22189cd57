"""examples/torch_digits.py, the demo (one Trainer.fit), on 2 ranks through `hvdkit run`: the same
result as the hand-written loop of examples/torch_digits_loop.py, and a second start resumes."""

import os

import pytest
from helpers import PYTHON, hvdkit_run, result_line

pytestmark = pytest.mark.dist


def _run(example, ckpt, *flags):
    proc = hvdkit_run("-np", "2", "--", PYTHON, example, "--checkpoint-dir", str(ckpt), "--compression", "none", *flags)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc, result_line(proc.stdout)


def test_the_trainer_example_ends_where_the_hand_written_loop_ends_and_a_second_start_resumes(tmp_path):
    _, trainer = _run("examples/torch_digits.py", tmp_path / "trainer")
    _, loop = _run("examples/torch_digits_loop.py", tmp_path / "loop")
    assert trainer["val_accuracy"] >= 0.95 and trainer["steps"] == loop["steps"] == 276
    assert (trainer["val_accuracy"], trainer["val_loss"]) == (loop["val_accuracy"], loop["val_loss"])
    assert sorted(os.listdir(tmp_path / "trainer")) == [".hvdkit.lock"] + [f"ckpt-{s:012d}" for s in (230, 253, 276)]
    proc, again = _run("examples/torch_digits.py", tmp_path / "trainer")
    assert again["resumed_from_epoch"] == 12 and again["steps"] == 276 and again["preempted"] is False
    assert "hvdkit.trainer: epoch" not in proc.stderr  # nothing left to train
