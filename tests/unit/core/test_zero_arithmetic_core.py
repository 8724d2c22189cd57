"""ZeRO-1's shared arithmetic (``hvdkit.core.zero``): the one copy torch and Keras both cut and pack with.

Each rank's parts of a round's piece must be within its own slice and cut as the engine cuts them;
``spans`` must name exactly the tensors a run of the flat vector covers, each element once; the
packer must keep every item once, in order, within the bound (or one larger item alone) and never
mix kinds. The torch and Keras sides must use these very functions and constants, not copies.
"""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hvdkit.core import zero
from hvdkit.core.errors import ConfigError
from hvdkit.core.zero import Piece, Slice, pack_rounds, partition, plan_rounds, rank_parts, spans

FAST = settings(max_examples=200, deadline=None)


def test_the_bounds_are_sixteen_mib_of_fp32():
    assert zero.ROUND_ELEMENTS == zero.CHUNK_ELEMENTS == 4 * 1024 * 1024


def test_rank_parts_examples():
    bounds = partition(5, 2)  # [0, 3), [3, 5)
    assert rank_parts(bounds, Piece(0, 0, 2)) == [(0, 2), (3, 5)]
    assert rank_parts(bounds, Piece(0, 2, 3)) == [(2, 3), (5, 5)]  # rank 1's slice is shorter: nothing
    assert rank_parts(partition(1, 3), Piece(0, 0, 1)) == [(0, 1), (1, 1), (1, 1)]


@FAST
@given(st.lists(st.integers(0, 300), max_size=4), st.integers(1, 9), st.integers(1, 400))
def test_the_rank_parts_of_a_plan_cover_each_ranks_slice_once_in_order_cut_as_the_engine_cuts(lengths, size, limit):
    bounds = [partition(n, size) for n in lengths]
    seen = [[[] for _ in range(size)] for _ in lengths]
    for round_ in plan_rounds(lengths, size, limit):
        for piece in round_:
            parts = rank_parts(bounds[piece.group], piece)
            assert len(parts) == size
            cut = partition(sum(b - a for a, b in parts), size)  # how reducescatter splits the pack
            assert [b - a for a, b in parts] == [s.stop - s.start for s in cut]
            for r, (a, b) in enumerate(parts):
                assert bounds[piece.group][r].start <= a <= b <= bounds[piece.group][r].stop
                seen[piece.group][r].extend(range(a, b))
    for g, n in enumerate(lengths):
        assert [seen[g][r] for r in range(size)] == [list(range(*s)) for s in partition(n, size)]


def test_spans_examples():
    offsets = [0, 3, 3, 7]  # tensors of 3, 0 and 4 elements
    assert list(spans(offsets, 2, 5)) == [(0, 2, 3), (2, 0, 2)]  # the empty tensor is skipped
    assert list(spans(offsets, 0, 7)) == [(0, 0, 3), (2, 0, 4)]
    assert list(spans(offsets, 4, 4)) == []
    assert list(spans([0], 0, 0)) == []


@FAST
@given(st.lists(st.integers(0, 12), max_size=7), st.data())
def test_spans_name_every_element_of_the_run_once_in_order_and_nothing_else(sizes, data):
    offsets = [0]
    for n in sizes:
        offsets.append(offsets[-1] + n)
    start = data.draw(st.integers(0, offsets[-1]))
    stop = data.draw(st.integers(start, offsets[-1]))
    found = list(spans(offsets, start, stop))
    assert [i for i, _, _ in found] == sorted({i for i, _, _ in found})
    covered = [offsets[i] + k for i, lo, hi in found for k in range(lo, hi)]
    assert covered == list(range(start, stop))
    assert all(0 <= lo < hi <= sizes[i] for i, lo, hi in found)


def test_pack_rounds_examples():
    assert pack_rounds([3, 4, 2, 10, 1, 1], 8) == [[0, 1], [2], [3], [4, 5]]
    assert pack_rounds([2, 2, 2, 2], 8, ["a", "a", "b", "a"]) == [[0, 1], [2], [3]]
    assert pack_rounds([0, 0, 5], 4) == [[0, 1], [2]]
    assert pack_rounds([], 8) == []


@FAST
@given(st.lists(st.tuples(st.integers(0, 20), st.sampled_from("ab")), max_size=10), st.integers(1, 25))
def test_packed_rounds_hold_every_item_once_in_order_within_the_bound_one_kind_each(items, limit):
    sizes, kinds = [n for n, _ in items], [k for _, k in items]
    rounds = pack_rounds(sizes, limit, kinds)
    assert [i for r in rounds for i in r] == list(range(len(items)))
    for r in rounds:
        assert r and (sum(sizes[i] for i in r) <= limit or len(r) == 1)
        assert len({kinds[i] for i in r}) == 1
    for a, b in zip(rounds, rounds[1:]):  # a new round only where the next item would not fit or differs
        assert sum(sizes[i] for i in a) + sizes[b[0]] > limit or kinds[a[-1]] != kinds[b[0]]


@pytest.mark.parametrize("limit", [0, -1, 2.0, True, "8"])
def test_pack_rounds_refuses_a_bad_limit_naming_it(limit):
    with pytest.raises(ConfigError, match=rf"limit must be an int >= 1 \(got {limit!r}\)"):
        pack_rounds([1], limit)


def test_slices_are_the_core_named_tuple():
    assert partition(3, 2)[1] == Slice(2, 3) and partition(3, 2)[1].start == 2
