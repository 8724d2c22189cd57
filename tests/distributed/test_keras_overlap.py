"""The Keras optimizer's allreduce split into groups (benchmarks.keras_overlap measures it), on 2 real ranks.

Every split must give the same training as one grouped allreduce: weights bitwise identical on
both ranks and within 1e-6 of one process on the ranks' batches together (training moves them by
~1e-1, so a group left out or averaged twice fails).
"""

import pool
import pytest

pytestmark = pytest.mark.dist


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    out = tmp_path_factory.mktemp("keras-overlap")
    return pool.run_worker("mpirun", "keras", "keras_overlap", out, timeout=500)  # a case of the pool's Keras job


@pytest.mark.parametrize("groups", ["1", "2", "3", "0"])
def test_split_allreduce_keeps_ranks_bitwise_identical_and_equal_to_one_process(ranks, groups):
    r0, r1 = (r["groups"][groups] for r in ranks)
    assert r0["digest"] == r1["digest"]
    assert r0["max_diff_vs_reference"] < 1e-6
    assert ranks[0]["moved"] > 1e-2


def test_groups_take_the_last_gradients_first_in_near_equal_slices(ranks):
    assert ranks[0]["split_6_into_4"] == [[4, 5], [2, 3], [1], [0]]
    assert ranks[0]["split_3_into_0"] == [[2], [1], [0]]
