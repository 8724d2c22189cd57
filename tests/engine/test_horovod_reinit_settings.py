"""Engine fix 18-common-reinit-keeps-fixed-settings: Horovod started again in the same process (an elastic
reset: a survivor of a lost worker, or the ranks a new worker joins) keeps the settings it was given.

Before the fix, every ``hvd.init()`` set the defaults of the tuned settings again, and one whose HOROVOD_*
variable had fixed it at an earlier start was written into another's place: with HOROVOD_CYCLE_TIME set (hvdkit
sets it over Gloo), the fusion threshold of a process that had been reset became 1 MB, while a new worker had
Horovod's 128 MB. Right after a join the two ranks fused different tensors into one Gloo allreduce and one of
them aborted in Gloo's transport thread (``op.preamble.length <= op.nbytes. 1041876 vs 5000``: the chaos soak
with ``--model big``, docs/elastic.md). With HOROVOD_FUSION_THRESHOLD set as well, the second start crashed.
One process, Horovod over Gloo, no launcher: scripts/hvd_reinit_settings.py.
"""

import json
import os
import re

import pytest
from helpers import PYTHON, ROOT, run_bounded

SCRIPT = ROOT / "tests" / "engine" / "scripts" / "hvd_reinit_settings.py"


def performed(log, tag):
    """The responses Horovod performed for the grouped allreduce ``tag``: one list of tensor names each."""
    found = re.findall(rf"Performing (grouped_allreduce\.probe\.{tag}[^\n]*)", log)
    return [[name.strip() for name in line.split(",")] for line in found]


@pytest.mark.parametrize(
    "settings",
    [{"HOROVOD_CYCLE_TIME": "0.5"}, {"HOROVOD_CYCLE_TIME": "0.5", "HOROVOD_FUSION_THRESHOLD": str(64 << 20)}],
    ids=["cycle-time-set", "cycle-time-and-fusion-threshold-set"],
)
def test_horovod_started_again_fuses_the_same_tensors_as_at_its_first_start(settings):
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("HOROVOD_")},
        "HOROVOD_CONTROLLER": "gloo",
        "HOROVOD_CPU_OPERATIONS": "gloo",
        "HOROVOD_LOG_LEVEL": "trace",
        **settings,
    }
    proc = run_bounded([PYTHON, str(SCRIPT)], timeout=120, env=env, cwd=ROOT)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]  # before the fix: -11 (SIGSEGV), both set
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out == {"first": [1.0, 2.0], "second": [1.0, 2.0]}
    both = ["grouped_allreduce.probe.{0}_1of2", "grouped_allreduce.probe.{0}_2of2"]
    log = proc.stdout + proc.stderr  # Horovod's log goes to stdout
    assert performed(log, "first") == [[n.format("first") for n in both]]
    assert performed(log, "second") == [[n.format("second") for n in both]]  # one response, as at first
