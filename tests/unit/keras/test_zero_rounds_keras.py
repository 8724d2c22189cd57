"""The arithmetic and the one-process paths of ZeRO-1's Keras rounds (``hvdkit.keras.zero_rounds``).

Every rank's parts of the reduce-scatter's rounds must cover its slice once and be cut as the
engine cuts a reduce-scatter; the all-gather's rounds must hold every variable once, in order,
within the bound; and scattering, refreshing and gathering must move exactly the right elements
of real Keras variables (one process: the paths that call no collective).
"""

import keras
import numpy as np
import pytest
import tensorflow as tf
from hypothesis import given, settings
from hypothesis import strategies as st

from hvdkit.core.errors import ConfigError
from hvdkit.core.zero import partition, plan_rounds
from hvdkit.keras.zero import _Shards
from hvdkit.keras.zero_rounds import gather, rank_parts, refresh, scatter, variable_rounds


def test_the_gathers_rounds_pack_consecutive_variables_up_to_the_bound_and_a_larger_one_alone():
    assert variable_rounds([3, 4, 2, 10, 1, 1], 8) == [[0, 1], [2], [3], [4, 5]]
    assert variable_rounds([], 8) == []


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 20), max_size=8), st.integers(1, 25))
def test_every_variable_is_in_one_round_in_order_and_only_a_lone_variable_exceeds_the_bound(sizes, limit):
    rounds = variable_rounds(sizes, limit)
    assert [i for r in rounds for i in r] == list(range(len(sizes)))
    for r in rounds:
        assert r and (sum(sizes[i] for i in r) <= limit or len(r) == 1)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 40), max_size=4), st.integers(1, 5), st.integers(1, 30))
def test_every_ranks_parts_of_the_rounds_cover_its_slice_once_cut_as_the_engine_cuts(lengths, size, limit):
    bounds = [partition(n, size) for n in lengths]
    seen = [[[] for _ in range(size)] for _ in lengths]
    for round_ in plan_rounds(lengths, size, limit):
        assert sum(b - a for p in round_ for a, b in rank_parts(bounds[p.group], p)) <= max(limit, size)
        for piece in round_:
            parts = rank_parts(bounds[piece.group], piece)
            cut = partition(sum(b - a for a, b in parts), size)  # how reducescatter splits the pack
            assert [b - a for a, b in parts] == [s.stop - s.start for s in cut]
            for r, (a, b) in enumerate(parts):
                seen[piece.group][r].extend(range(a, b))
    for g, n in enumerate(lengths):
        for r, s in enumerate(partition(n, size)):
            assert seen[g][r] == list(range(s.start, s.stop))


def _variables():
    return [
        keras.Variable(np.arange(12, dtype="float32").reshape(3, 4), name="a"),
        keras.Variable(np.float32(100.0), name="b"),
        keras.Variable(np.arange(200, 210, dtype="float32").reshape(2, 5), name="c"),
    ]


def _flat(variables):
    return np.concatenate([np.ravel(v.numpy()) for v in variables])


def test_refresh_copies_this_ranks_slice_of_the_variables_into_its_shard():
    variables = _variables()
    zero = _Shards(variables, 1, 3)  # 23 elements: rank 1 owns [8, 16)
    refresh(zero)
    assert zero.groups[0].shard.numpy().tolist() == _flat(variables)[8:16].tolist()


def test_at_one_rank_scatter_returns_the_flat_gradient_and_gather_writes_the_shard_back():
    variables = _variables()
    zero = _Shards(variables, 0, 1)
    grads = [tf.ones((3, 4)), None, tf.fill((2, 5), 2.0)]
    out, stats = scatter(zero, grads, None, True, 5)  # fp16 is not applied without a collective
    assert out[0].numpy().tolist() == [1.0] * 12 + [0.0] + [2.0] * 10
    assert stats == {"rounds": 5, "largest_round": 5}
    zero.groups[0].shard.assign(np.arange(23, dtype="float32") * 0.5)
    gather(zero, None, "test", 4)
    assert _flat(variables).tolist() == (np.arange(23) * 0.5).tolist()


def test_a_round_size_that_is_not_a_positive_int_is_refused_naming_it():
    zero = _Shards(_variables(), 0, 1)
    with pytest.raises(ConfigError, match=r"round_elements must be an integer >= 1 \(got 0\)"):
        gather(zero, None, "test", 0)
