"""The torch adapter's contracts on 2 real ranks, under mpirun and under horovodrun --gloo.

The pool's torch job of each launcher (tests/support/pool.py) runs tests/distributed/workers/torch_contracts.py; each test reads what the
ranks recorded and asserts one contract.
"""

import math
import os

import pool
import pytest
from helpers import LAUNCHERS

from hvdkit.core.checkpoint import verify

pytestmark = pytest.mark.dist
# fp16 compression rounds each averaged gradient to ~3 significant digits; over 5 SGD steps the
# parameters stay within this of the fp32 reference. A wrong reduction moves them far more (the
# test checks that too), so the tolerance still catches a sum-instead-of-mean or a missing rank.
FP16_TOL = 2e-3


@pytest.fixture(scope="module", params=LAUNCHERS)
def ranks(request, tmp_path_factory):
    out = tmp_path_factory.mktemp(request.param)
    results = pool.run_worker(request.param, "torch", "torch_contracts", out, timeout=300)
    return {"launcher": request.param, "out": out, "r": results}


def test_both_ranks_ran_in_one_job_of_size_two(ranks):
    assert [r["rank"] for r in ranks["r"]] == [0, 1]
    assert {r["size"] for r in ranks["r"]} == {2}


def test_broadcast_state_gives_every_rank_rank0s_initial_parameters(ranks):
    r0, r1 = (r["training"] for r in ranks["r"])
    assert r0["init_digest"] == r1["init_digest"]


@pytest.mark.parametrize("variant", ["fp32", "fp16", "accum2", "bf16_autocast"])
def test_parameters_are_bitwise_identical_on_both_ranks_after_training(ranks, variant):
    r0, r1 = (r["training"][variant] for r in ranks["r"])
    assert r0["digest"] == r1["digest"]


def test_two_ranks_with_batch_b_match_one_process_with_batch_2b_in_fp32(ranks):
    t = ranks["r"][0]["training"]
    assert t["moved"] > 1e-2  # training really changed the parameters
    assert t["fp32"]["max_diff_vs_reference"] <= 1e-6


def test_gradient_accumulation_over_two_passes_matches_the_reference(ranks):
    assert ranks["r"][0]["training"]["accum2"]["max_diff_vs_reference"] <= 1e-6


def test_fp16_compression_stays_within_a_tolerance_a_wrong_reduction_exceeds(ranks):
    t = ranks["r"][0]["training"]
    assert t["fp16"]["max_diff_vs_reference"] <= FP16_TOL
    assert t["fp16"]["max_diff_vs_reference"] > 0  # compression really happened
    assert t["wrong_sum_diff"] > 5 * FP16_TOL and t["wrong_missing_rank_diff"] > 5 * FP16_TOL


def test_bf16_autocast_trains_close_to_the_fp32_reference(ranks):
    diff = ranks["r"][0]["training"]["bf16_autocast"]["max_diff_vs_reference"]
    assert 0 < diff < 0.05


def test_uneven_shards_average_to_the_metric_over_all_ten_samples(ranks):
    squares = [i * i for i in range(10)]
    for r in ranks["r"]:
        m = r["metrics"]
        assert m["averaged"]["loss"] == pytest.approx(sum(squares) / 10, rel=1e-12)
        assert m["averaged"]["accuracy"] == pytest.approx(0.5, rel=1e-12)
    assert [r["metrics"]["local"]["loss"][1] for r in ranks["r"]] == [7, 3]


def test_ranks_tracking_different_metrics_all_get_an_error(ranks):
    for r in ranks["r"]:
        assert "ranks track different metrics" in r["metrics"]["mismatch_error"]


def test_broadcast_state_with_extras_of_different_types_completes(ranks):
    for r in ranks["r"]:
        assert r["broadcast"]["extra"] == {"epoch": 7, "note": "from rank 0"}
        assert r["broadcast"]["extra2"] == 3.5


def test_only_rank0_creates_files_in_the_checkpoint_directory(ranks):
    r0, r1 = (r["checkpoint"] for r in ranks["r"])
    assert r0["listing"] == [".hvdkit.lock", "ckpt-000000000003"]  # the lock: one job per directory
    assert r1["listing"] is None and not os.path.exists(ranks["out"] / "ckpt-of-rank1")
    assert verify(str(ranks["out"] / "ckpt-of-rank0" / "ckpt-000000000003"))["world_size"] == 2


def test_resume_restores_parameters_optimizer_state_and_step_on_every_rank(ranks):
    for r in ranks["r"]:
        saved, restored = r["checkpoint"]["saved"], r["checkpoint"]["restored"]
        assert restored["params"] == saved["params"]
        assert restored["momentum"] == saved["momentum"]
        assert math.isclose(restored["lr"], saved["lr"]) and saved["lr"] == pytest.approx(0.1 * 0.5**3)
        assert (restored["step"], restored["epoch"], restored["extra"]) == (3, 1, {"seen": 3})
        assert restored["next_rand"] == saved["next_rand"]  # each rank's own RNG state came back
    assert ranks["r"][0]["checkpoint"]["saved"]["params"] == ranks["r"][1]["checkpoint"]["restored"]["params"]


def test_a_checkpoint_of_another_model_is_a_clear_error_and_stays_intact(ranks):
    for r in ranks["r"]:
        assert "does not fit this model" in r["checkpoint"]["wrong_model_error"]
    verify(str(ranks["out"] / "ckpt-of-rank0" / "ckpt-000000000003"))


def test_bad_input_raises_clear_errors_on_every_rank(ranks):
    for r in ranks["r"]:
        bad = r["bad_input"]
        assert "not writable" in bad["unwritable"] and "a-file" in bad["unwritable"]
        assert "compression must be one of 'none', 'fp16', 'auto' (got 'int8')" in bad["compression"]
        assert "torch.optim.Optimizer (got str)" in bad["not_optimizer"]


def test_zero_grad_takes_set_to_none_and_still_refuses_to_zero_gradients_being_averaged(ranks):
    for r in ranks["r"]:
        z = r["zero_grad"]
        assert z["set_to_none_False"] == [0.0, 0.0]  # zeroed in place
        assert z["set_to_none_True"] == [None, None]
        assert "before optimizer.step()" in z["before_step"]
