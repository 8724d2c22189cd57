"""End to end: the TensorFlow/Keras examples as users start them, through `hvdkit run`."""

import os
import re

import pytest
from helpers import PYTHON, hvdkit_run, result_line

pytestmark = pytest.mark.dist


@pytest.fixture(scope="module")
def keras_run(keras_demo):
    """The Keras example's run of the session (tests/e2e/conftest.py: over MPI, compression "auto"). Over Gloo the
    example is no other maths: `horovodrun --gloo` trains the same Keras script in
    tests/engine/test_public_scripts_keras.py and the in-process recovery tests train it over Gloo."""
    return {"ckpt": keras_demo.ckpt, "result": keras_demo.result, "stderr": keras_demo.proc.stderr}


def test_keras_fit_example_reaches_95_percent_on_two_ranks(keras_run):
    r = keras_run["result"]
    assert (r["world_size"], r["epochs"], r["resumed_from_epoch"], r["steps"]) == (2, 12, 0, 12 * 23)
    assert r["val_accuracy"] >= 0.95
    assert "[rank 0/2] hvdkit.examples.keras_digits: epoch 12/12" in keras_run["stderr"]


def test_keras_fit_example_reports_the_compression_auto_chose(keras_run):
    chosen = re.findall(r"compression='auto' -> '(\w+)'", keras_run["stderr"])
    assert len(chosen) == 1 and chosen[0] in ("none", "fp16"), chosen  # decided once, logged on rank 0
    assert keras_run["result"]["compression"] == chosen[0]


def test_keras_fit_example_resumes_from_its_last_checkpoint(keras_demo, keras_run, tmp_path):
    assert sorted(os.listdir(keras_run["ckpt"]))[-1] == "ckpt-000000000276"
    ckpt = keras_demo.copy_to(tmp_path / "ckpt")  # the session's folder is read only
    proc = hvdkit_run("-np", "2", "--", PYTHON, "examples/keras_digits.py", "--checkpoint-dir", str(ckpt))
    assert proc.returncode == 0, proc.stderr[-5000:]
    again = result_line(proc.stdout)
    assert again["resumed_from_epoch"] == 12 and again["steps"] == 276
    assert (again["val_accuracy"], again["val_loss"]) == (
        keras_run["result"]["val_accuracy"],
        keras_run["result"]["val_loss"],
    )


def test_tf_custom_loop_example_reaches_95_percent_on_two_ranks(tmp_path):
    proc = hvdkit_run("-np", "2", "--", PYTHON, "examples/tf_custom_loop.py", "--checkpoint-dir", str(tmp_path / "c"))
    assert proc.returncode == 0, proc.stdout + proc.stderr[-5000:]
    r = result_line(proc.stdout)
    assert (r["world_size"], r["steps"]) == (2, 276)
    assert r["val_accuracy"] >= 0.95
    chosen = re.findall(r"compression='auto' -> '(\w+)'", proc.stderr)
    assert len(chosen) == 1 and r["compression"] == chosen[0], chosen  # measured once, reported as chosen
