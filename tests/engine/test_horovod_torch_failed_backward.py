"""Engine fix 79-torch-failed-hook-finishes-in-flight: an allreduce that cannot be queued in the middle of a backward
pass (Horovod shut down by a lost worker: ``hk.elastic.run`` then goes back to its last commit) ends the allreduces
queued before it in that pass. Before the fix they stayed in the optimizer: ``zero_grad()`` refused ever after
("optimizer.zero_grad() was called after loss.backward() but before optimizer.step()"), which ended the survivor of a
kill that came during a backward pass (the chaos soak with ``--model big``, whose backward passes are long).
One process, Horovod over Gloo, no launcher: scripts/hvd_torch_failed_backward.py."""

import json
import os

from helpers import PYTHON, ROOT, run_bounded

SCRIPT = ROOT / "tests" / "engine" / "scripts" / "hvd_torch_failed_backward.py"


def test_an_allreduce_refused_in_a_backward_pass_ends_the_queued_ones_and_the_optimizer_trains_on():
    env = {**os.environ, "HOROVOD_CONTROLLER": "gloo", "HOROVOD_CPU_OPERATIONS": "gloo"}
    proc = run_bounded([PYTHON, str(SCRIPT)], timeout=120, env=env, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["backward"].startswith("HorovodInternalError: ")
    assert out["zero_grad"] is None and out["next_step"] is None, out
    assert out["max_diff_vs_plain_sgd"] < 1e-6  # the next step averaged this pass's gradients, nothing left over
