"""TensorFlow restore on 2 real ranks sends each variable in chunks: bitwise on every rank.

The pool's Keras job under mpirun runs tests/distributed/workers/restore_tf.py with 1,000-byte chunks; it also saves
with ``async_save=True`` while the model trains on during the (held) write.
"""

import pool
import pytest

pytestmark = pytest.mark.dist


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    return pool.run_worker("mpirun", "keras", "restore_tf", tmp_path_factory.mktemp("restore-tf"), timeout=400)


def test_every_rank_restores_the_saved_weights_and_optimizer_bitwise_through_many_chunks(ranks):
    saved = ranks[0]["saved"]
    for r in ranks:
        assert r["before"] != saved  # a fresh model: the restore really moved it
        assert r["restored"] == saved
        assert r["resumed"] == [2, 2, {"k": 1}] and r["iterations"] == 2


def test_a_rank_whose_model_differs_fails_every_rank_with_a_checkpoint_error(ranks):
    errors = [r["mismatch_error"] for r in ranks]
    assert errors[0] is not None and errors[0] == errors[1]
    assert "rank 1 cannot take rank 0's checkpoint" in errors[0]
    assert "(29, 38) float32 here, (29, 37) float32 on rank 0" in errors[0]


def test_a_keras_async_save_restores_the_state_at_save_time_bitwise_as_the_sync_save(ranks):
    for r in ranks:
        a = r["async"]
        assert a["saved"] == ranks[0]["saved"]  # the same state the synchronous save of this job wrote
        assert a["moved_on"] and a["same_path"]
        assert a["restored"] == a["saved"] and a["resumed"] == [2, 2, {"k": 1}]
