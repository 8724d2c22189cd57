"""``mixed_float16`` with 2 accumulated batches a step on 2 real ranks: an overflow on one rank, in one batch of one
optimizer step, skips that whole step on both ranks (``hvdkit.keras.loss_scale``).

A case of the pool's Keras job runs tests/distributed/workers/keras_amp_overflow.py: ``model.fit`` of 5 optimizer
steps (10 batches) through ``hk.DistributedOptimizer(LossScaleOptimizer(SGD), backward_passes_per_step=2)``, loss
scale 1024 doubling after 2 good steps; in step 2's second batch rank 1 feeds an input past float16's range. The
one-process tests of the same logic: tests/unit/keras/test_elastic_keras_amp.py.
"""

import pool
import pytest

pytestmark = pytest.mark.dist

K, SKIPPED = 2, 2
FIRST, LAST = SKIPPED * K, SKIPPED * K + K - 1  # the skipped step's batches
STATE = ("scale", "good", "iterations", "raw", "accumulators_zero", "weights", "momentum")


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    out = tmp_path_factory.mktemp("keras-amp-overflow")
    return pool.run_worker("mpirun", "keras", "keras_amp_overflow", out, timeout=400)


def _step_ends(rank, key):
    return [b[key] for b in rank["batches"][K - 1 :: K]]


def test_only_rank_1_overflows_and_only_in_the_second_batch_of_step_2(ranks):
    assert [r["policy"] for r in ranks] == ["mixed_float16", "mixed_float16"]
    assert ranks[0]["own_gradients_finite"] == [True, True]  # rank 0 skips on rank 1's word alone
    assert ranks[1]["own_gradients_finite"] == [True, False]
    assert ranks[1]["overflowing_batch"] == LAST


def test_both_ranks_hold_the_same_loss_scale_counts_accumulators_and_weights_after_every_batch(ranks):
    r0, r1 = ranks
    assert len(r0["batches"]) == len(r1["batches"]) == 10
    for b0, b1 in zip(r0["batches"], r1["batches"], strict=True):
        assert [b0[k] for k in STATE] == [b1[k] for k in STATE]


def test_the_step_with_the_overflow_applies_nothing_halves_the_scale_once_and_keeps_the_step_count(ranks):
    for rank in ranks:
        batches = rank["batches"]
        before, first, last = batches[FIRST - 1], batches[FIRST], batches[LAST]
        assert first["weights"] == last["weights"] == before["weights"]  # bitwise, and on both ranks (above)
        assert first["momentum"] == last["momentum"] == before["momentum"]
        assert before["scale"] == first["scale"] == 2048.0 and last["scale"] == 1024.0
        assert last["good"] == 0
        assert before["iterations"] == last["iterations"] == 2
        assert last["raw"] == before["raw"] == 4  # back at the step's start: the step did not happen
        assert not first["accumulators_zero"] and last["accumulators_zero"]  # the finite first batch was emptied


def test_every_good_step_counts_once_toward_the_scale_and_the_steps_after_the_overflow_train_normally(ranks):
    for rank in ranks:
        assert _step_ends(rank, "scale") == [1024.0, 2048.0, 1024.0, 1024.0, 2048.0]
        assert _step_ends(rank, "good") == [1, 0, 0, 1, 0]
        assert _step_ends(rank, "iterations") == [1, 2, 2, 3, 4]
        assert _step_ends(rank, "accumulators_zero") == [True] * 5
        assert [b["accumulators_zero"] for b in rank["batches"][::K]] == [False] * 5  # a step's first batch adds
        weights = _step_ends(rank, "weights")
        assert len({weights[0], weights[1], weights[3], weights[4]}) == 4  # each good step moves the weights
        assert rank["final_finite"] and rank["moved"] > 1e-2
    assert ranks[0]["final"] == ranks[1]["final"]


def test_the_run_ends_where_a_run_without_the_skipped_steps_batches_ends(ranks):
    """The scales differ between the two runs from step 2 on; a power of two scales every gradient exactly, so
    the unscaled gradients agree (measured: bitwise, difference 0.0). A step of this SGD moves weights by ~1e-2."""
    for rank in ranks:
        assert rank["max_diff_vs_reference"] <= 1e-6
