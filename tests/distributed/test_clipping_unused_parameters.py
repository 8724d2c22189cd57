"""``max_grad_norm`` when a parameter has no gradient on one rank in a step, on 2 real ranks.

A branch used only for rank 1's samples (a skipped layer, routing, LayerDrop) has no gradient on
rank 0 until Horovod averages it in ``step()``. If the list of parameters to clip were taken before
that, rank 0's norm would leave the branch out: the ranks would clip by different factors and drift
apart without an error. Both ranks must end bitwise identical and equal (to rounding) to one process
on the concatenated batch with the same clipping.
"""

import pool
import pytest
from helpers import LAUNCHERS

pytestmark = pytest.mark.dist
MAX_NORM = 0.05  # as in the worker
TOL = 1e-6


@pytest.fixture(scope="module", params=LAUNCHERS)
def ranks(request, tmp_path_factory):
    out = tmp_path_factory.mktemp(f"clip-unused-{request.param}")
    return pool.run_worker(request.param, "torch", "clipping_unused_torch", out, timeout=400)


def test_the_branch_really_has_no_gradient_on_rank_0_before_step(ranks):
    r0, r1 = ranks
    assert all(r0["branch_grad_none_before_step"])
    assert not any(r1["branch_grad_none_before_step"])
    assert min(r0["reference_norms"]) > 10 * MAX_NORM  # clipping acts at every step


def test_clipping_with_a_branch_unused_on_one_rank_keeps_ranks_bitwise_identical(ranks):
    r0, r1 = ranks
    assert r0["norms"] == r1["norms"]
    assert r0["digest"] == r1["digest"]


def test_clipping_with_a_branch_unused_on_one_rank_matches_one_process_on_the_whole_batch(ranks):
    for r in ranks:
        assert r["norms"] == pytest.approx(r["reference_norms"], rel=1e-5)
        assert r["max_diff_vs_reference"] < TOL
        assert r["branch_moved"] > 1e-3  # the branch trained on both ranks


def test_the_clipping_optimizer_is_a_class_not_methods_patched_onto_horovods_instance(ranks):
    for r in ranks:
        assert r["methods_set_on_the_instance"] == []
