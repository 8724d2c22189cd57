"""A script shaped like Horovod's public TF2 synthetic benchmark runs unchanged on hvdkit's engine,
started by ``horovodrun -np 2 --gloo`` and ``mpirun -np 2``, the two launchers existing Horovod scripts use
(``hvdkit run`` starting an unchanged TensorFlow script is checked by test_public_scripts_keras.py, whose
script runs under all three: one TensorFlow job less, about 25 s of the suite).

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
COMMANDS = ("horovodrun-gloo", "mpirun")


@pytest.mark.parametrize("launcher", COMMANDS)
def test_the_tf2_synthetic_benchmark_runs_unchanged_on_two_ranks_and_reports_throughput(launcher):
    run_synthetic_benchmark(launcher, SCRIPT, FLAGS)
