"""A script shaped like Horovod's public TF2 synthetic benchmark runs unchanged on hvdkit's engine,
started by ``horovodrun -np 2 --gloo``, ``mpirun -np 2`` and ``hvdkit run -np 2``.

On the upstream engine it dies on both ranks at its first step, in ``DistributedGradientTape.gradient``
(``'Variable' object has no attribute 'ref'``, Keras 3 variables; fix 10), and its
``hvd.broadcast_variables(model.variables)`` needs fix 11.
"""

import pytest
from helpers import ROOT
from synthetic import run_synthetic_benchmark

pytestmark = pytest.mark.dist

SCRIPT = ROOT / "tests" / "engine" / "scripts" / "tf2_synthetic_benchmark.py"
# Small enough for shared CPU cores: a 32x32 MobileNetV2, batch 4, three timed steps.
FLAGS = [
    "--model",
    "MobileNetV2",
    "--image-size",
    "32",
    "--num-classes",
    "10",
    "--batch-size",
    "4",
    "--num-warmup-batches",
    "1",
    "--num-batches-per-iter",
    "1",
    "--num-iters",
    "2",
    "--no-cuda",
]
COMMANDS = ("horovodrun-gloo", "mpirun", "hvdkit-run")


@pytest.mark.parametrize("launcher", COMMANDS)
def test_the_tf2_synthetic_benchmark_runs_unchanged_on_two_ranks_and_reports_throughput(launcher):
    run_synthetic_benchmark(launcher, SCRIPT, FLAGS)
