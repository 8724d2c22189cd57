"""A TF2 Keras script shaped like Horovod's public example runs unchanged under every launcher.

tests/engine/scripts/keras_fit_example.py (hvd.DistributedOptimizer, model.fit with
BroadcastGlobalVariablesCallback, MetricAverageCallback, LearningRateWarmupCallback, checkpoints on
rank 0) under horovodrun --gloo, mpirun and hvdkit run, 2 ranks each.
"""

import re

import pytest
from helpers import PYTHON, ROOT, hvdkit_run, launcher_argv, run_bounded

pytestmark = pytest.mark.dist
EXAMPLE = ROOT / "tests" / "engine" / "scripts" / "keras_fit_example.py"
EPOCHS = 3
DONE = re.compile(r"worker (\d) of 2 done: loss ([\d.]+) -> ([\d.]+), accuracy ([\d.]+), weights sha256 (\w+)")


def run_example(launcher, checkpoint_dir):
    args = [PYTHON, str(EXAMPLE), "--epochs", str(EPOCHS), "--checkpoint-dir", str(checkpoint_dir)]
    if launcher == "hvdkit":
        return hvdkit_run("-np", "2", "--", *args, timeout=400)
    return run_bounded(launcher_argv(launcher, 2) + args, timeout=400)


@pytest.mark.parametrize("launcher", ["horovodrun-gloo", "mpirun", "hvdkit"])
def test_keras_fit_example_trains_to_the_same_weights_on_both_ranks(launcher, tmp_path):
    proc = run_example(launcher, tmp_path)
    text = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"{launcher}: exit {proc.returncode}\n{text[-6000:]}"
    done = {int(m.group(1)): m.groups()[1:] for m in DONE.finditer(text)}
    assert sorted(done) == [0, 1], text[-4000:]
    first, last, accuracy, sha0 = done[0]
    assert done[1][3] == sha0  # BroadcastGlobalVariablesCallback + averaged gradients: identical weights
    assert done[1][:3] == done[0][:3]  # MetricAverageCallback: both ranks log the same averaged numbers
    assert float(last) < float(first) and float(accuracy) > 0.3  # it learned (chance is 0.1)
    assert text.count("finished gradual learning rate warmup to 0.004") == 1  # rank 0 only, verbose=1
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"checkpoint-{e}.keras" for e in range(1, EPOCHS + 1)]
