"""ZeRO-1 (``shard_optimizer_state=True``) for Keras 3 on 2 real ranks, under mpirun and horovodrun --gloo.

The sharded optimizer must train what the unsharded ``hk.DistributedOptimizer`` trains (to fp32
rounding) under ``model.fit`` and in custom loops, keep the ranks bitwise identical, hold about half
the slot state on each rank, and save checkpoints holding the unsharded state, which resume 2 -> 2,
2 -> 1 (unsharded and sharded) and 1 -> 2 ranks as an uninterrupted run. Worker:
workers/zero_keras.py (55 trainable elements, 28 on rank 0 and 27 on rank 1, around a frozen layer).
``train`` in the pool's Keras job under mpirun, ``resume`` in a 1-rank job, ``regrow`` in the pool's job under horovodrun --gloo
(which trains two of the kinds again, so both launchers are checked).
"""

import numpy as np
import pool
import pytest
from helpers import ROOT

pytestmark = pytest.mark.dist
WORKER = ROOT / "tests" / "distributed" / "workers" / "zero_keras.py"
KINDS = ("sgd", "adam", "adamw", "sgd_clip", "adam_fp16", "sgd_accum")
RUNS = [("train", k) for k in KINDS] + [("regrow", "sgd_clip"), ("regrow", "adam_fp16")]  # regrow: gloo
IDS = [f"{'mpirun' if m == 'train' else 'gloo'}-{k}" for m, k in RUNS]
OTHERS = ("Adamax", "Nadam", "RMSprop", "Adagrad", "Adadelta", "Lion", "Ftrl")
TOL = 1e-6  # relative, fp32 rounding
# sgd_accum: a momentum and a gradient accumulator per element (sharded: both the size of the slice)
PLAIN_SLOTS = {"sgd": 55, "adam": 110, "adamw": 110, "sgd_clip": 55, "adam_fp16": 110, "sgd_accum": 110}
ITERATIONS = {"sgd": 16, "adamw": 16, "sgd_clip": 16, "sgd_accum": 8}  # under model.fit (16 batches); eager: 3


def _results(launcher, np_, out, mode):
    return pool.mode_results(launcher, "keras", WORKER, np_, out, mode, timeout=560)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    out = tmp_path_factory.mktemp("zero-keras")
    return {
        "train": _results("mpirun", 2, out, "train"),
        "resume": _results("mpirun", 1, out, "resume")[0],
        "regrow": _results("horovodrun-gloo", 2, out, "regrow"),
    }


def _flat(weights):
    return np.concatenate([np.ravel(np.asarray(w, dtype=np.float64)) for w in weights])


@pytest.mark.parametrize(("mode", "kind"), RUNS, ids=IDS)
def test_sharded_weights_are_bitwise_equal_on_every_rank_and_frozen_ones_untouched(runs, mode, kind):
    r0, r1 = runs[mode]
    assert r0[kind]["digest"] == r1[kind]["digest"]
    assert r0[kind]["frozen_digest"] == r1[kind]["frozen_digest"]
    assert r0[kind]["frozen_kept"] and r1[kind]["frozen_kept"]


@pytest.mark.parametrize(("mode", "kind"), RUNS, ids=IDS)
def test_sharded_training_equals_the_unsharded_optimizer_to_fp32_rounding(runs, mode, kind):
    for r in runs[mode]:
        assert r[kind]["rel_diff"] < TOL
        assert r[kind]["moved"] > 1e-2  # the weights really trained
        assert r[kind]["iterations"] == ITERATIONS.get(kind, 3)


def test_global_clipnorm_clips_by_the_norm_of_the_whole_gradient(runs):
    for r in runs["train"]:
        assert r["sgd_clip"]["rel_diff"] < TOL  # the unsharded optimizer's global norm, from the slices
        assert r["sgd_clip"]["vs_unclipped"] > 0.1  # and the clipping acted


@pytest.mark.parametrize(("mode", "kind"), RUNS, ids=IDS)
def test_each_rank_holds_about_half_the_slot_state(runs, mode, kind):
    ranks = [r[kind] for r in runs[mode]]
    plain = PLAIN_SLOTS[kind]  # 55 trainable elements, one or two slots each
    per_slot = plain // 55
    assert [r["plain_slot_elements"] for r in ranks] == [plain, plain]
    assert [r["slot_elements"] for r in ranks] == [28 * per_slot, 27 * per_slot]  # every element once
    assert sum(r["slot_elements"] for r in ranks) == plain


@pytest.mark.parametrize("kind", OTHERS)
def test_every_other_allowed_optimizer_trains_sharded_as_unsharded_with_about_half_the_state(runs, kind):
    ranks = [r[kind] for r in runs["train"]]
    assert ranks[0]["digest"] == ranks[1]["digest"]
    for r in ranks:
        assert r["rel_diff"] < TOL
        assert r["moved"] > 1e-3
        assert r["slot_elements"] <= r["plain_slot_elements"] / 2 + 3
    assert sum(r["slot_elements"] for r in ranks) == ranks[0]["plain_slot_elements"]


def test_the_consolidated_state_is_the_unsharded_optimizers_variables(runs):
    for r in runs["train"]:
        assert r["consolidated_shapes_match"]
        assert r["consolidated_rel_diff"] < TOL
        assert r["consolidated_iterations"] == 16


def test_a_sharded_checkpoint_resumed_sharded_at_the_same_size_ends_bitwise_as_the_uninterrupted_run(runs):
    for r in runs["train"]:
        assert r["resumed_step"] == 8 and r["resumed_iterations"] == 8
        assert r["resumed_digest"] == r["uninterrupted_digest"]


def test_a_sharded_2_rank_checkpoint_resumes_at_1_rank_sharded_or_not_and_continues_equal(runs):
    uninterrupted = _flat(runs["train"][0]["uninterrupted"])
    resumed = runs["resume"]
    assert resumed["iterations"] == 8
    for key in ("unsharded", "sharded"):
        ended = _flat(resumed[key])
        assert np.max(np.abs(ended - uninterrupted)) / np.max(np.abs(uninterrupted)) < 1e-5


def test_a_1_rank_unsharded_checkpoint_resumes_sharded_at_2_ranks_under_gloo_and_continues_equal(runs):
    uninterrupted = _flat(runs["train"][0]["uninterrupted"])
    r0, r1 = runs["regrow"]
    assert r0["digest"] == r1["digest"]
    assert r0["step"] == 12 and r0["world_size"] == 1 and r0["iterations"] == 12
    assert [r0["slot_elements"], r1["slot_elements"]] == [56, 54]
    assert np.max(np.abs(_flat(r0["weights"]) - uninterrupted)) / np.max(np.abs(uninterrupted)) < 1e-5


def test_checkpoint_callback_in_a_sharded_fit_saves_what_the_unsharded_optimizer_holds(runs):
    resumed, plain = runs["resume"], runs["train"][0]["plain_adamw_state"]
    assert resumed["fit_epoch"] == 1
    assert len(resumed["fit_state"]) == len(plain) == 10  # iteration, learning rate, 2 moments x 4 variables
    assert resumed["fit_state"][0] == plain[0] == 16
    saved, want = _flat(resumed["fit_state"][2:]), _flat(plain[2:])
    assert np.max(np.abs(saved - want)) / np.max(np.abs(want)) < TOL
