"""A script shaped like Horovod's public PyTorch synthetic benchmark runs unchanged on hvdkit's engine,
started by ``horovodrun -np 2 --gloo``, ``mpirun -np 2`` and ``hvdkit run -np 2``.

The script (``scripts/pytorch_synthetic_benchmark.py``) uses only Horovod's public API:
``hvd.DistributedOptimizer`` with ``--fp16-allreduce``, ``hvd.broadcast_parameters``,
``hvd.broadcast_optimizer_state``; its model is a small torch-only conv net (torchvision does not
load here). Only rank 0 prints.
"""

import re

import pytest

from helpers import PYTHON, ROOT, launcher_argv, run_bounded

pytestmark = pytest.mark.dist

SCRIPT = ROOT / "tests" / "engine" / "scripts" / "pytorch_synthetic_benchmark.py"
# Small enough for shared CPU cores: 16x16 images, batch 4, two timed iterations of two batches.
FLAGS = ["--fp16-allreduce", "--model", "resnet_tiny", "--image-size", "16", "--num-classes", "10", "--batch-size", "4",
         "--num-warmup-batches", "2", "--num-batches-per-iter", "2", "--num-iters", "2", "--no-cuda"]
COMMANDS = ("horovodrun-gloo", "mpirun", "hvdkit-run")


@pytest.mark.parametrize("launcher", COMMANDS)
def test_the_pytorch_synthetic_benchmark_runs_unchanged_on_two_ranks_and_reports_throughput(launcher):
    proc = run_bounded(launcher_argv(launcher, 2) + [PYTHON, str(SCRIPT), *FLAGS], 600)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"{launcher}: exit {proc.returncode}\n{output[-6000:]}"
    assert "Number of CPUs: 2" in output
    assert output.count("Running benchmark...") == 1  # rank 0 alone prints
    assert len(re.findall(r"Iter #\d: [\d.]+ img/sec per CPU", output)) == 2, output[-3000:]
    total = re.search(r"Total img/sec on 2 CPU\(s\): ([\d.]+) \+-", output)
    assert total and float(total.group(1)) > 0, output[-3000:]
    assert "Traceback" not in output, output[-3000:]
