"""A script shaped like Horovod's public PyTorch synthetic benchmark runs unchanged on hvdkit's engine,
started by ``horovodrun -np 2 --gloo``, ``mpirun -np 2`` and ``hvdkit run -np 2``.

The script (``scripts/pytorch_synthetic_benchmark.py``) uses only Horovod's public API:
``hvd.DistributedOptimizer`` with ``--fp16-allreduce``, ``hvd.broadcast_parameters``,
``hvd.broadcast_optimizer_state``; its model is a small torch-only conv net (torchvision does not
load here). Only rank 0 prints.
"""

import pytest
from helpers import ROOT
from synthetic import run_synthetic_benchmark

pytestmark = pytest.mark.dist

SCRIPT = ROOT / "tests" / "engine" / "scripts" / "pytorch_synthetic_benchmark.py"
# Small enough for shared CPU cores: 16x16 images, batch 4, two timed iterations of two batches.
FLAGS = [
    "--fp16-allreduce",
    "--model",
    "resnet_tiny",
    "--image-size",
    "16",
    "--num-classes",
    "10",
    "--batch-size",
    "4",
    "--num-warmup-batches",
    "2",
    "--num-batches-per-iter",
    "2",
    "--num-iters",
    "2",
    "--no-cuda",
]
COMMANDS = ("horovodrun-gloo", "mpirun", "hvdkit-run")


@pytest.mark.parametrize("launcher", COMMANDS)
def test_the_pytorch_synthetic_benchmark_runs_unchanged_on_two_ranks_and_reports_throughput(launcher):
    output = run_synthetic_benchmark(launcher, SCRIPT, FLAGS)
    assert output.count("Running benchmark...") == 1  # rank 0 alone prints
