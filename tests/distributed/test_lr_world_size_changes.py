"""The torch learning-rate rule across world-size changes, on real ranks: a run saved by 1 rank,
resumed by 2, then by 1 again, uses at every step the rate the linear rule gives for the ranks of
that leg (``ScaledLRScheduler``, restored through ``Checkpointer``). Before the fix the scheduler
state was loaded twice at a resume, so the ratio was squared: 0.4 at 2 ranks where the rule gives 0.2.

Under ``mpirun`` only: the rate comes from the checkpoint and ``hvd.size()``, which the controller does not
change. Under Gloo, jobs change size in the elastic tests (tests/multihost/test_elastic_two_hosts.py restarts at
another size, tests/e2e/test_in_process_recovery.py shrinks and grows in process).
"""

import json

import pytest
from helpers import ROOT, run_ranks

from hvdkit.core import warmup_factor

pytestmark = pytest.mark.dist
WORKER = ROOT / "tests" / "distributed" / "workers" / "lr_resume_torch.py"
LR, WARMUP = 0.1, 4  # as in the worker
LEGS = ((1, 2), (2, 3), (1, 2), (2, 1))  # (ranks, optimizer steps): into the warmup, past it, back and forth


@pytest.fixture(scope="module")
def legs(tmp_path_factory):
    d = tmp_path_factory.mktemp("lr-resume-torch")
    ranks = []
    for i, (np_, steps) in enumerate(LEGS):
        out = d / f"leg{i}"
        out.mkdir()
        proc = run_ranks("mpirun", np_, [str(WORKER), str(out), str(d / "ckpt"), str(steps)], timeout=300)
        assert proc.returncode == 0, f"leg {i} ({np_} ranks) failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
        ranks.append(([json.loads((out / f"rank{r}.json").read_text())["used"] for r in range(np_)], proc.stderr))
    return ranks


def test_every_rank_of_every_leg_uses_the_rate_the_rule_gives_for_that_legs_ranks(legs):
    step = 0
    for (np_, steps), (used, _) in zip(LEGS, legs):
        expected = [[t, LR * warmup_factor(t, WARMUP, float(np_))] for t in range(step, step + steps)]
        for rank_used in used:  # every rank alike
            assert rank_used == [[t, pytest.approx(lr, rel=1e-12)] for t, lr in expected]
        step += steps


def test_rank_0_logs_the_rescaling_once_per_resume_at_another_size(legs):
    for i, (_, stderr) in enumerate(legs):
        assert stderr.count("learning-rate rule re-applied for this world size") == (0 if i == 0 else 1), stderr[-3000:]
