"""ZeRO-1's round plan (``hvdkit.core.zero.plan_rounds``): how step() cuts its collectives into bounded rounds.

Every rank must cover its slice of every flat vector exactly once (else an element is reduced
twice or never), each round's parts of one vector must be the cut Horovod's ``reducescatter``
makes of their concatenation (``partition`` of their sum), and no round may exceed the bound.
"""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hvdkit.core.errors import ConfigError
from hvdkit.core.zero import Piece, partition, plan_rounds

FAST = settings(max_examples=200, deadline=None)


def parts(length, size, piece):
    """Each rank's elements of ``piece`` in the flat vector, as ``(start, stop)``."""
    return [(a + min(piece.lo, b - a), a + min(piece.hi, b - a)) for a, b in partition(length, size)]


@FAST
@given(st.lists(st.integers(0, 3000), max_size=5), st.integers(1, 16), st.integers(1, 5000))
def test_rounds_cover_every_ranks_slice_once_within_the_bound(lengths, size, limit):
    rounds = plan_rounds(lengths, size, limit)
    covered = [[0] * n for n in lengths]
    for round_ in rounds:
        assert round_  # no empty round
        assert len({p.group for p in round_}) == len(round_)  # a vector at most once per round
        total = 0
        for piece in round_:
            cut = parts(lengths[piece.group], size, piece)
            sizes = [b - a for a, b in cut]
            assert sizes == [b - a for a, b in partition(sum(sizes), size)]  # the engine's own cut
            total += sum(sizes)
            for a, b in cut:
                for i in range(a, b):
                    covered[piece.group][i] += 1
        assert total <= max(limit, size)
    assert all(c == 1 for vector in covered for c in vector)


def test_rounds_examples():
    assert plan_rounds([43, 15, 1], 2, 1000) == [[Piece(0, 0, 22), Piece(1, 0, 8), Piece(2, 0, 1)]]
    assert plan_rounds([5], 2, 4) == [[Piece(0, 0, 2)], [Piece(0, 2, 3)]]
    assert plan_rounds([0, 0], 2, 4) == []
    assert plan_rounds([3], 4, 1) == [[Piece(0, 0, 1)]]  # fewer elements than ranks: one round, one each


@pytest.mark.parametrize(("size", "limit", "named"), [(0, 4, "size"), (2, 0, "limit"), (2, 2.0, "limit")])
def test_rounds_refuse_bad_input_naming_it(size, limit, named):
    with pytest.raises(ConfigError, match=rf"{named} must be an int >= 1"):
        plan_rounds([4], size, limit)
