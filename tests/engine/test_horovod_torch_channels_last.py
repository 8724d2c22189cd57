"""A Horovod script with a channels_last model trains on 2 real ranks (engine fix 77).

channels_last is the memory format of convolutions on GPUs under AMP; its tensors are not
contiguous in torch's default sense, and upstream Horovod refused them in every collective:
``broadcast_parameters``, ``broadcast_optimizer_state`` and each step's gradient allreduce. Runs on
CPU (the format is the same there), under mpirun and horovodrun --gloo.
"""

import json

import pytest
from helpers import LAUNCHERS, ROOT, run_ranks

pytestmark = pytest.mark.dist
SCRIPT = ROOT / "tests" / "engine" / "scripts" / "hvd_torch_channels_last.py"


@pytest.fixture(scope="module", params=LAUNCHERS)
def ranks(request, tmp_path_factory):
    out = tmp_path_factory.mktemp(f"hvd-torch-channels-last-{request.param}")
    proc = run_ranks(request.param, 2, [str(SCRIPT), str(out)], timeout=300)
    assert proc.returncode == 0, f"{request.param} job failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    records = [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]
    for rec in records:
        assert "error" not in rec, f"{rec['error']}\n{rec['traceback']}"
    return records


def test_the_model_really_is_channels_last(ranks):
    assert all(r["weight_is_channels_last"] and not r["weight_is_contiguous"] for r in ranks)


def test_broadcast_parameters_gives_every_rank_rank0s_channels_last_weights(ranks):
    assert ranks[0]["init_digest"] == ranks[1]["init_digest"]


def test_the_averaged_steps_match_one_process_on_the_global_batch(ranks):
    assert ranks[0]["digest"] == ranks[1]["digest"]
    assert ranks[0]["max_diff_vs_reference"] < 1e-6
    assert all(r["grad_keeps_its_format"] for r in ranks)  # averaged into the gradient, still channels_last


def test_broadcast_optimizer_state_takes_channels_last_momentum(ranks):
    assert ranks[0]["state_channels_last"]
    assert ranks[0]["state_digest"] == ranks[1]["state_digest"]
