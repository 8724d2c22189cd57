"""ZeRO-1's slicing of torch param groups and its refusals (``hvdkit.torch.zero``), without ranks.

The slices must be the ones Horovod's ``reducescatter`` hands each rank (balanced, the first
``length % size`` ranks one element more; checked on 3 real ranks when this was written), contiguous,
and cover every element exactly once, or a gradient element would be updated twice or never.
"""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hvdkit.core import zero as core_zero
from hvdkit.core.errors import ConfigError
from hvdkit.torch.zero import ELEMENTWISE_OPTIMIZERS, Slice, _Group, check_shardable, partition

FAST = settings(max_examples=200, deadline=None)

# torch's first optimizer step sets TORCHINDUCTOR_CACHE_DIR: take it at import, not inside a test
# (the conftest fails a test that changes the environment).
torch.optim.SGD(torch.nn.Linear(1, 1).parameters(), lr=0.1).step()


def test_the_torch_side_cuts_with_the_core_partition():
    # its properties and Horovod's cut: tests/unit/core/test_zero_partition_core.py
    assert partition is core_zero.partition and Slice is core_zero.Slice


shapes = st.lists(st.lists(st.integers(0, 5), min_size=0, max_size=3), min_size=1, max_size=6)


@FAST
@given(shapes, st.integers(1, 9))
def test_each_ranks_slice_of_the_flattened_group_joined_in_rank_order_is_the_whole_group(dims, size):
    params = [torch.nn.Parameter(torch.randn(tuple(d))) for d in dims]
    values = [torch.randn(tuple(d)) for d in dims]
    groups = [_Group(params, r, size) for r in range(size)]
    flat = groups[0].flat(values)
    assert torch.equal(torch.cat([g.own(values) for g in groups]), flat)
    assert [g.shard.numel() for g in groups] == [s.stop - s.start for s in partition(flat.numel(), size)]
    assert all(torch.equal(a, b) for a, b in zip(groups[0].unflatten(flat), values))


def test_frozen_parameters_are_left_out_of_the_flattened_group():
    frozen = torch.nn.Parameter(torch.ones(4), requires_grad=False)
    group = _Group([torch.nn.Parameter(torch.zeros(3)), frozen], 0, 2)
    assert group.offsets == [0, 3]
    assert group.slice == Slice(0, 2)


@pytest.mark.parametrize("cls", ELEMENTWISE_OPTIMIZERS, ids=lambda c: c.__name__)
def test_torchs_elementwise_optimizers_are_accepted(cls):
    check_shardable(cls([torch.nn.Parameter(torch.zeros(3))], lr=0.1))


def test_lbfgs_is_refused_naming_the_class_and_the_fix():
    with pytest.raises(ConfigError, match=r"cannot shard LBFGS.*shard_optimizer_state=False"):
        check_shardable(torch.optim.LBFGS([torch.nn.Parameter(torch.zeros(3))]))


def test_a_subclass_of_an_allowed_optimizer_is_refused_its_step_may_not_be_elementwise():
    class Custom(torch.optim.Adam):
        pass

    with pytest.raises(ConfigError, match="cannot shard Custom"):
        check_shardable(Custom([torch.nn.Parameter(torch.zeros(3))]))


def test_a_param_group_mixing_dtypes_is_refused():
    params = [torch.nn.Parameter(torch.zeros(3)), torch.nn.Parameter(torch.zeros(3, dtype=torch.float64))]
    with pytest.raises(ConfigError, match="one dtype and device per param group"):
        check_shardable(torch.optim.SGD(params, lr=0.1))
