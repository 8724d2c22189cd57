"""The global batch plan and the global-sample-offset layout, in one process (pure arithmetic).

The property test (Hypothesis) plays a whole epoch as any sequence of stops and restarts at
random world sizes: the union of every rank's micro-batches must be the dataset exactly once
(with ``drop_last``: exactly the documented part of the epoch's order), every rank must get the
same number of non-empty micro-batches per segment, and with a fixed global batch every
optimizer step must hold the same samples whatever the world size.
"""

import math
from collections import Counter

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hvdkit.core import ConfigError
from hvdkit.core.data import epoch_order, plan_batches, position_after, rank_batches, rank_seed, step_bounds

FAST = settings(
    max_examples=300, deadline=None, derandomize=True, database=None, suppress_health_check=[HealthCheck.too_slow]
)


def test_a_fixed_global_batch_picks_the_accumulation_for_each_world_size():
    assert [plan_batches(32, n, global_batch_size=64).accumulation for n in (1, 2)] == [2, 1]
    assert plan_batches(8, 4, global_batch_size=96).accumulation == 3
    assert plan_batches(32, 1, global_batch_size=64).describe() == (
        "world size 1: global batch 64 = 32 per rank x 1 rank x 2 accumulation steps"
    )
    assert plan_batches(32, 2, global_batch_size=64).describe() == (
        "world size 2: global batch 64 = 32 per rank x 2 ranks x 1 accumulation step"
    )


def test_without_a_global_batch_the_accumulation_is_kept_and_the_global_batch_follows_the_size():
    plan = plan_batches(32, 3, accumulation=2)
    assert (plan.accumulation, plan.global_batch_size, plan.fixed) == (2, 192, False)
    assert "changes with the world size" in plan.describe()


def test_a_global_batch_that_does_not_divide_names_the_values_and_a_batch_size_that_works():
    with pytest.raises(ConfigError) as e:
        plan_batches(32, 3, global_batch_size=64)
    message = str(e.value)
    assert "global_batch_size=64" in message and "batch_size=32" in message and "3 ranks" in message
    assert "multiple of 96" in message  # 64 / 3 is not whole: only a global batch change helps
    with pytest.raises(ConfigError, match=r"per-rank batch_size of 16 or 8 or 4"):
        plan_batches(24, 4, global_batch_size=64)  # 64 / 4 = 16 per rank: 16, 8, 4 divide it


@pytest.mark.parametrize("bad", [0, -64, 64.0, True, "64"])
def test_a_global_batch_that_is_not_a_positive_integer_is_refused(bad):
    with pytest.raises(ConfigError, match="global_batch_size must be"):
        plan_batches(32, 2, global_batch_size=bad)


def test_the_epoch_order_depends_on_seed_and_epoch_only():
    a = epoch_order(100, seed=3, epoch=1)
    assert np.array_equal(a, epoch_order(100, seed=3, epoch=1))
    assert sorted(a.tolist()) == list(range(100))
    assert not np.array_equal(a, epoch_order(100, seed=3, epoch=2))
    assert not np.array_equal(a, epoch_order(100, seed=4, epoch=1))
    assert epoch_order(5, 0, 0, shuffle=False).tolist() == [0, 1, 2, 3, 4]


def test_a_short_remainder_joins_the_last_step_so_no_micro_batch_is_empty():
    assert step_bounds(10, 0, 4, slots=2) == [(0, 4), (4, 8), (8, 10)]  # remainder 2 >= 2 slots: its own step
    assert step_bounds(9, 0, 4, slots=2) == [(0, 4), (4, 9)]  # remainder 1 < 2 slots: merged
    assert step_bounds(9, 0, 4, slots=2, drop_last=True) == [(0, 4), (4, 8)]
    assert step_bounds(9, 8, 4, slots=2) == [(8, 9)]  # fewer left than slots (after growing): see slot_positions
    with pytest.raises(ConfigError, match="offset must be a whole number from 0 to 9"):
        step_bounds(9, 10, 4, slots=2)


def test_rank_seeds_are_distinct_per_rank_and_step_and_repeatable():
    seeds = {rank_seed(0, step, rank) for step in range(3) for rank in range(4)}
    assert len(seeds) == 12 and rank_seed(0, 1, 2) == rank_seed(0, 1, 2)
    assert all(0 <= s < 2**63 for s in seeds)


@st.composite
def runs(draw):
    """An epoch played as segments ``(size, steps or None for 'to the end')`` with a batch plan."""
    n = draw(st.integers(1, 400))
    batch = draw(st.integers(1, 9))
    sizes = draw(st.lists(st.integers(1, 5), min_size=1, max_size=5))
    fixed = draw(st.booleans())
    global_batch = batch * math.lcm(*sizes) * draw(st.integers(1, 3)) if fixed else None
    accumulation = draw(st.integers(1, 3))
    stops = [draw(st.integers(0, 6)) for _ in sizes[:-1]] + [None]
    return n, batch, global_batch, accumulation, list(zip(sizes, stops)), draw(st.booleans()), draw(st.integers(0, 5))


@FAST
@given(runs())
def test_any_sequence_of_world_sizes_sees_every_sample_exactly_once_per_epoch(run):
    n, batch, global_batch, accumulation, segments, drop_last, epoch = run
    order = epoch_order(n, seed=11, epoch=epoch)
    seen, start, short_tail = Counter(), 0, False
    steps_by_position = {}
    for size, stop in segments:
        plan = plan_batches(batch, size, global_batch, accumulation)
        bounds = step_bounds(n, start, plan.global_batch_size, plan.slots, drop_last)
        taken = bounds if stop is None else bounds[:stop]
        short_tail |= any(end - begin < plan.slots for begin, end in taken)
        per_rank = [list(rank_batches(order, taken, r, size, plan.accumulation)) for r in range(size)]
        assert {len(b) for b in per_rank} == {len(taken) * plan.accumulation}  # same count on every rank
        assert all(len(batch_) > 0 for b in per_rank for batch_ in b)  # never an empty micro-batch
        for (begin, end), i in zip(taken, range(len(taken))):
            step = sorted(
                x for b in per_rank for micro in b[i * plan.accumulation : (i + 1) * plan.accumulation] for x in micro
            )
            steps_by_position.setdefault(begin, []).append((end, step))
        for b in per_rank:
            for micro in b:
                seen.update(micro)
        start = position_after(bounds, len(taken), start)
    dropped = n - start if drop_last else 0
    assert start == n - dropped
    if short_tail:  # only after a restart at a larger size without a fixed global batch, or n < slots
        assert global_batch is None or n < plan_batches(batch, 1, global_batch).slots
        assert set(seen) == set(order[: n - dropped].tolist())
    else:
        assert seen == Counter(order[: n - dropped].tolist())  # exactly once; drop_last: the end of the order
    if global_batch is not None and not short_tail:  # a fixed global batch: the same steps and samples at any size
        for begin, variants in steps_by_position.items():
            assert len({(end, tuple(step)) for end, step in variants}) == 1
            assert variants[0][1] == sorted(order[begin : variants[0][0]].tolist())
