"""A restore whose rank-0-only steps fail ends with a clear CheckpointError on every rank, not a hang.

The pool's torch job of each launcher runs tests/distributed/workers/restore_errors.py, bounded in time:
a rank left waiting for rank 0 would hang the case and fail the fixture naming it.
"""

import pool
import pytest
from helpers import LAUNCHERS

pytestmark = pytest.mark.dist


@pytest.fixture(scope="module", params=LAUNCHERS)
def ranks(request, tmp_path_factory):
    out = tmp_path_factory.mktemp(f"restore-errors-{request.param}")
    return pool.run_worker(request.param, "torch", "restore_errors", out, timeout=240)


@pytest.mark.parametrize("how, reason", [("file", "Not a directory"), ("loop", "Too many levels of symbolic links")])
def test_a_checkpoint_folder_rank0_cannot_list_fails_every_rank_with_a_checkpoint_error(ranks, how, reason):
    errors = [r[how]["error"] for r in ranks]
    assert errors[0] is not None and errors[0] == errors[1]  # the same message on both ranks
    assert reason in errors[0] and f"ckpt-{how}" in errors[0] and "rank 0" in errors[0]
    assert "--checkpoint-dir" in errors[0]  # the fix is named


def test_a_rank_whose_model_differs_fails_every_rank_of_broadcast_state(ranks):
    errors = [r["mismatched_model"]["error"] for r in ranks]
    assert errors[0] is not None and errors[0] == errors[1]
    assert "rank 1 cannot take rank 0's state" in errors[0] and "weight" in errors[0]
