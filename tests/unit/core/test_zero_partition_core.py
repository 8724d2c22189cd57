"""ZeRO-1's framework-free partition arithmetic (``hvdkit.core.zero``), shared by the Keras side.

The slices must be the ones Horovod's ``reducescatter`` hands each rank (balanced, the first
``length % size`` ranks one element more), contiguous and covering every element once, or a
gradient element would be updated twice or never.
"""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hvdkit.core.errors import ConfigError
from hvdkit.core.zero import Slice, partition

FAST = settings(max_examples=200, deadline=None)


@FAST
@given(st.integers(0, 10_000), st.integers(1, 512))
def test_core_partition_is_contiguous_balanced_and_covers_every_element_once(length, size):
    slices = partition(length, size)
    assert len(slices) == size
    assert slices[0].start == 0 and slices[-1].stop == length
    for a, b in zip(slices, slices[1:]):
        assert a.stop == b.start
    sizes = [s.stop - s.start for s in slices]
    assert max(sizes) - min(sizes) <= 1
    assert sizes == sorted(sizes, reverse=True)  # the larger slices first
    assert sizes.count(length // size + 1) == (length % size if length % size else 0)
    assert sum(sizes) == length


def test_core_partition_examples_as_horovods_reducescatter_cuts():
    assert partition(5, 3) == [Slice(0, 2), Slice(2, 4), Slice(4, 5)]
    assert partition(55, 2) == [Slice(0, 28), Slice(28, 55)]
    assert partition(1, 2) == [Slice(0, 1), Slice(1, 1)]  # rank 1 owns nothing
    assert partition(0, 2) == [Slice(0, 0), Slice(0, 0)]


@pytest.mark.parametrize(
    ("length", "size", "named"),
    [(-1, 2, "length"), (2.0, 2, "length"), (True, 2, "length"), (5, 0, "size"), (5, "2", "size")],
)
def test_core_partition_refuses_bad_input_naming_it(length, size, named):
    with pytest.raises(
        ConfigError, match=rf"{named} must be an int .*\(got {length if named == 'length' else size!r}\)"
    ):
        partition(length, size)
