"""A script shaped like Horovod's public TF2 synthetic benchmark runs unchanged on hvdkit's engine,
started by ``horovodrun -np 2 --gloo``, ``mpirun -np 2`` and ``hvdkit run -np 2``.

On the upstream engine it dies on both ranks at its first step, in ``DistributedGradientTape.gradient``
(``'Variable' object has no attribute 'ref'``, Keras 3 variables; fix 10), and its
``hvd.broadcast_variables(model.variables)`` needs fix 11.
"""

import re

import pytest

from helpers import PYTHON, ROOT, launcher_argv, run_bounded

pytestmark = pytest.mark.dist

SCRIPT = ROOT / "tests" / "engine" / "scripts" / "tf2_synthetic_benchmark.py"
# Small enough for shared CPU cores: a 32x32 MobileNetV2, batch 4, three timed steps.
FLAGS = ["--model", "MobileNetV2", "--image-size", "32", "--num-classes", "10", "--batch-size", "4",
         "--num-warmup-batches", "1", "--num-batches-per-iter", "1", "--num-iters", "2", "--no-cuda"]
COMMANDS = ("horovodrun-gloo", "mpirun", "hvdkit-run")


@pytest.mark.parametrize("launcher", COMMANDS)
def test_the_tf2_synthetic_benchmark_runs_unchanged_on_two_ranks_and_reports_throughput(launcher):
    proc = run_bounded(launcher_argv(launcher, 2) + [PYTHON, str(SCRIPT), *FLAGS], 600)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"{launcher}: exit {proc.returncode}\n{output[-6000:]}"
    assert "Number of CPUs: 2" in output
    assert len(re.findall(r"Iter #\d: [\d.]+ img/sec per CPU", output)) == 2, output[-3000:]
    total = re.search(r"Total img/sec on 2 CPU\(s\): ([\d.]+) \+-", output)
    assert total and float(total.group(1)) > 0, output[-3000:]
    assert "Traceback" not in output, output[-3000:]
