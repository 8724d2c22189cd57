"""A bad HVDKIT_* value that ranks read only later (progress, straggler threshold, compression) fails
``init()`` on every rank, naming the variable, its text and the fix, before any training step: not
minutes or hours into the job when the first progress line or straggler report reads it."""

import os
import re

import pytest
from helpers import PYTHON, ROOT, launcher_argv, run_bounded

pytestmark = pytest.mark.dist
# One write per line: print()'s separate writes of two ranks can interleave in mpirun's output.
SCRIPT = "import os, hvdkit.{0} as hk; hk.init(); os.write(1, b'STARTED %d\\n' % hk.rank())"
BAD = [
    ("HVDKIT_PROGRESS_INTERVAL", "ten", "ten"),
    ("HVDKIT_PROGRESS", "maybe", "maybe"),
    ("HVDKIT_STRAGGLER_THRESHOLD", "0.5", "0.5"),
    ("HVDKIT_COMPRESSION", "fp8", "fp8"),
]


def _start(launcher, framework, extra):
    env = {k: v for k, v in os.environ.items() if not k.startswith("HVDKIT_")}
    env.update(extra)
    argv = launcher_argv(launcher, 2) + [PYTHON, "-c", SCRIPT.format(framework)]
    return run_bounded(argv, 120, env=env, cwd=ROOT)


@pytest.mark.parametrize(("name", "value", "shown"), BAD)
def test_a_bad_value_fails_init_on_every_rank_naming_the_variable(name, value, shown):
    proc = _start("mpirun", "torch", {name: value})
    text = proc.stdout + proc.stderr
    assert proc.returncode != 0, text[-3000:]
    assert "STARTED" not in text  # init() itself refused
    assert name in text and repr(shown) in text, text[-3000:]
    assert "ConfigError" in text


def test_keras_ranks_under_gloo_check_the_same_variables():
    proc = _start("horovodrun-gloo", "keras", {"HVDKIT_STRAGGLER_THRESHOLD": "1"})
    text = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "STARTED" not in text, text[-3000:]
    assert "HVDKIT_STRAGGLER_THRESHOLD" in text and "'1'" in text


def test_good_values_start_as_before():
    good = {
        "HVDKIT_PROGRESS_INTERVAL": "2.5",
        "HVDKIT_PROGRESS": "0",
        "HVDKIT_STRAGGLER_THRESHOLD": "1.5",
        "HVDKIT_COMPRESSION": "fp16",
    }
    proc = _start("mpirun", "torch", good)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    assert sorted(re.findall(r"STARTED (\d+)", proc.stdout)) == ["0", "1"]
