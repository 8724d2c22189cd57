"""A subclass of the class hvd.DistributedOptimizer builds trains correctly on 2 real ranks (fix 75).

One job per launcher runs `scripts/hvd_torch_subclass.py`: users' subclass of ``type(opt)``
overrides ``synchronize()`` and ``step()`` with ``super()`` calls, for SGD (momentum) and AdamW
after ``broadcast_optimizer_state``. Upstream every call recursed forever (RecursionError).
"""

import json

import pytest
from helpers import LAUNCHERS, ROOT, run_ranks

pytestmark = pytest.mark.dist
SCRIPT = ROOT / "tests" / "engine" / "scripts" / "hvd_torch_subclass.py"
STEPS = 3


@pytest.fixture(scope="module", params=LAUNCHERS)
def ranks(request, tmp_path_factory):
    out = tmp_path_factory.mktemp(f"hvd-torch-subclass-{request.param}")
    proc = run_ranks(request.param, 2, [str(SCRIPT), str(out)], timeout=300)
    assert proc.returncode == 0, f"{request.param} job failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]


@pytest.mark.parametrize("opt_name", ["sgd", "adamw"])
def test_subclass_of_distributed_optimizer_trains_bitwise_identical_ranks_equal_to_one_process(ranks, opt_name):
    r0, r1 = (r[opt_name] for r in ranks)
    for rec in (r0, r1):
        assert "error" not in rec, f"{rec['error']}\n{rec['traceback']}"
    assert r0["digest"] == r1["digest"]
    assert r0["max_diff_vs_reference"] < 1e-6
    assert r0["moved"] > 1e-2
    assert r0["is_horovod_class"] is True


@pytest.mark.parametrize("opt_name", ["sgd", "adamw"])
def test_the_subclass_overrides_run_once_per_step(ranks, opt_name):
    for rec in (r[opt_name] for r in ranks):
        assert "error" not in rec, rec["error"]
        assert (rec["sync_calls"], rec["step_calls"]) == (STEPS, STEPS)
