"""Expensive runs that several end-to-end modules compare against, made once per session (issue 38)."""

import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from subprocess import CompletedProcess

import pytest
from helpers import PYTHON, hvdkit_run, result_line

DEMO = "examples/torch_digits.py"
KERAS_DEMO = "examples/keras_digits.py"


@dataclass(frozen=True)
class ReferenceRun:
    """A finished run: its process (output), its final JSON line and its checkpoint folder.

    ``ckpt`` is shared by every test that asks for the run: read it, never write to it. A test that resumes
    from it, or changes it, works on ``copy_to(folder)``."""

    proc: CompletedProcess
    result: dict
    ckpt: Path
    seconds: float  # the run's wall time, launcher start to exit

    def copy_to(self, dest: Path) -> Path:
        shutil.copytree(self.ckpt, dest)
        return dest


@pytest.fixture(scope="session")
def torch_demo(tmp_path_factory) -> ReferenceRun:
    """The README's demo on 2 ranks over MPI with its default flags (12 epochs, checkpoints every epoch),
    compression pinned to fp16 so that the runs compared with it choose alike (helpers.fixed_compression):
    ``hvdkit run -np 2 -- python examples/torch_digits.py --checkpoint-dir D``. The reference of
    test_hvdkit_run, test_fault_tolerance and test_trainer_example, which each ran it themselves before."""
    ckpt = tmp_path_factory.mktemp("torch-demo") / "ckpt"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HVDKIT_COMPRESSION", "fp16")
        t0 = time.monotonic()
        proc = hvdkit_run("-np", "2", "--", PYTHON, DEMO, "--checkpoint-dir", str(ckpt))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    return ReferenceRun(proc=proc, result=result_line(proc.stdout), ckpt=ckpt, seconds=time.monotonic() - t0)


@pytest.fixture(scope="session")
def keras_demo(tmp_path_factory) -> ReferenceRun:
    """The Keras example on 2 ranks over MPI with its default flags (12 epochs, checkpoints every epoch,
    compression "auto", whose choice its result line gives): ``hvdkit run -np 2 -- python examples/keras_digits.py
    --checkpoint-dir D``. The run test_tf_examples checks and test_fault_tolerance's Keras restart compares with
    (pinning the compression this run chose), which each ran a 12-epoch Keras job of their own before."""
    ckpt = tmp_path_factory.mktemp("keras-demo") / "ckpt"
    with pytest.MonkeyPatch.context() as mp:
        mp.delenv("HVDKIT_COMPRESSION", raising=False)  # "auto" decides, as for a user (a module may pin it)
        t0 = time.monotonic()
        proc = hvdkit_run("-np", "2", "--", PYTHON, KERAS_DEMO, "--checkpoint-dir", str(ckpt))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    return ReferenceRun(proc=proc, result=result_line(proc.stdout), ckpt=ckpt, seconds=time.monotonic() - t0)
