"""Gradient clipping after averaging and the scaled learning rate, on 2 real ranks.

torch runs under mpirun and horovodrun --gloo, Keras/TensorFlow under mpirun. Clipping must act on
the averaged gradient: parameters end bitwise identical on both ranks and equal (to rounding) to one
process with the double batch and the same clipping, while clipping each rank's gradient before
averaging gives a measurably different model (so these tests can fail). The LR schedules must give
2x (linear) and sqrt(2)x (sqrt) the single-process rate on 2 ranks, reached by linear warmup.
"""

import json
import math

import pool
import pytest
from helpers import LAUNCHERS

pytestmark = pytest.mark.dist
MAX_NORM = 0.05  # as in the workers
TOL = 1e-6  # fp32 rounding over a few steps; per-rank clipping moves the weights by ~2.5e-3
LR = 0.1


def run(framework, launcher, tmp_path_factory):
    out = tmp_path_factory.mktemp(f"lr-clip-{framework}-{launcher}")
    results = pool.run_worker(launcher, framework, f"lr_clipping_{framework}", out, timeout=400)
    c = results[0]["clipping"]
    print(
        json.dumps(
            {
                "job": [framework, launcher],
                "per_rank_clip_diff": c["per_rank_clip_diff"],
                "max_diff_vs_reference": {k: v["max_diff_vs_reference"] for k, v in c.items() if isinstance(v, dict)},
            }
        )
    )
    return results


@pytest.fixture(scope="module", params=LAUNCHERS)
def torch_ranks(request, tmp_path_factory):
    return run("torch", request.param, tmp_path_factory)


@pytest.fixture(scope="module")
def keras_ranks(tmp_path_factory):
    return run("keras", "mpirun", tmp_path_factory)


def warmup(scale, steps, warmup_steps=4):
    return [LR * (1 + (scale - 1) * min(s, warmup_steps) / warmup_steps) for s in range(steps)]


def check_identical_on_both_ranks_and_like_one_process(ranks, variant):
    """Both ranks trained ``variant`` to the same bits, within TOL of one process with the double
    batch, and training really moved the weights; rank 0's clipping record."""
    r0, r1 = (r["clipping"][variant] for r in ranks)
    assert r0["digest"] == r1["digest"]
    assert r0["max_diff_vs_reference"] < TOL
    c = ranks[0]["clipping"]
    assert c["moved"] > 1e-3
    return c


@pytest.mark.parametrize("variant", ["max_grad_norm", "manual_recipe", "accum2"])
def test_torch_clipped_training_is_bitwise_identical_on_both_ranks_and_matches_one_process(torch_ranks, variant):
    check_identical_on_both_ranks_and_like_one_process(torch_ranks, variant)


def test_torch_max_grad_norm_clips_the_averaged_gradient_every_step(torch_ranks):
    for r in torch_ranks:
        c = r["clipping"]
        assert min(c["reference_norms"]) > 10 * MAX_NORM  # clipping was active at every step
        assert c["max_grad_norm"]["norms"] == pytest.approx(c["reference_norms"], rel=1e-5)  # the global batch's norm


def test_torch_clipping_each_ranks_gradient_before_averaging_would_differ_measurably(torch_ranks):
    assert torch_ranks[0]["clipping"]["per_rank_clip_diff"] > 100 * TOL


def test_torch_scale_lr_gives_2x_linear_and_sqrt2x_after_warmup_on_two_ranks(torch_ranks):
    for r in torch_ranks:
        assert r["lr"]["linear"] == pytest.approx(warmup(2.0, 7), rel=1e-12)
        assert r["lr"]["linear"][-1] == pytest.approx(2 * LR, rel=1e-12)
        assert r["lr"]["sqrt"] == pytest.approx(warmup(math.sqrt(2), 7), rel=1e-12)
        assert r["lr"]["sqrt"][-1] == pytest.approx(math.sqrt(2) * LR, rel=1e-12)


@pytest.mark.parametrize("variant", ["fit_global_clipnorm", "tape_clip_by_global_norm", "tape_optimizer_clipnorm"])
def test_keras_and_tape_clipping_acts_on_the_averaged_gradient(keras_ranks, variant):
    c = check_identical_on_both_ranks_and_like_one_process(keras_ranks, variant)
    assert c["first_norm"] > 10 * MAX_NORM  # clipping was active from the first step


def test_keras_clipping_each_ranks_gradient_before_averaging_would_differ_measurably(keras_ranks):
    assert keras_ranks[0]["clipping"]["per_rank_clip_diff"] > 100 * TOL


def test_keras_scaled_lr_warmup_callback_and_schedule_give_the_expected_rates_on_two_ranks(keras_ranks):
    for r in keras_ranks:
        lr = r["lr"]
        assert lr["scaled_lr"] == pytest.approx({"linear": 2 * LR, "sqrt": math.sqrt(2) * LR, "none": LR}, rel=1e-12)
        for rule, scale in (("linear", 2.0), ("sqrt", math.sqrt(2))):
            # 4 batches per epoch: the callback warms up over epoch 1, the schedule over 4 steps
            assert lr[f"warmup_callback_{rule}"] == pytest.approx(warmup(scale, 8), rel=1e-6)
            assert lr[f"schedule_{rule}"] == pytest.approx(warmup(scale, 8), rel=1e-6)


def test_keras_schedules_see_optimizer_steps_when_gradients_accumulate(keras_ranks):
    """8 batches at accumulation 2 are 4 optimizer steps: the warmup and a halving per step run at
    steps 0-3 (Keras 3.15 alone evaluated them at batches 1, 3, 5, 7)."""
    expected = [w * 0.5**s for s, w in enumerate(warmup(2.0, 4))]
    for r in keras_ranks:
        assert r["lr"]["schedule_accumulation_2"] == pytest.approx(expected, rel=1e-6)
