"""examples/torch_digits.py, the demo (one Trainer.fit), on 2 ranks through `hvdkit run`: the same
result as the hand-written loop of examples/torch_digits_loop.py (a second start of the demo resumes:
tests/e2e/test_hvdkit_run.py)."""

import pytest
from helpers import (
    PYTHON,
    fixed_compression,  # noqa: F401 - autouse: HVDKIT_COMPRESSION=fp16, as in the session's demo run
    hvdkit_run,
    result_line,
)

pytestmark = pytest.mark.dist


def test_the_trainer_example_ends_where_the_hand_written_loop_ends(torch_demo, tmp_path):
    proc = hvdkit_run("-np", "2", "--", PYTHON, "examples/torch_digits_loop.py", "--checkpoint-dir", str(tmp_path))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    loop, trainer = result_line(proc.stdout), torch_demo.result
    assert trainer["val_accuracy"] >= 0.95 and trainer["steps"] == loop["steps"] == 276
    assert trainer["compression"] == "fp16"  # both pinned alike: the comparison below is exact
    assert (trainer["val_accuracy"], trainer["val_loss"]) == (loop["val_accuracy"], loop["val_loss"])
