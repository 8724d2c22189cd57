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
from hvdkit.torch.zero import ELEMENTWISE_OPTIMIZERS, Slice, check_shardable, partition, release_freed_memory
from hvdkit.torch.zero_flat import FlatGroup

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
    groups = [FlatGroup(params, r, size, 0) for r in range(size)]
    flat = torch.cat([v.reshape(-1) for v in values]) if values else torch.zeros(0)
    assert torch.equal(torch.cat([g.own(values) for g in groups]), flat)
    assert [g.shard.numel() for g in groups] == [s.stop - s.start for s in partition(flat.numel(), size)]
    assert all(torch.equal(a, b) for a, b in zip(groups[0].unflatten(flat), values))


def test_frozen_parameters_are_left_out_of_the_flattened_group():
    frozen = torch.nn.Parameter(torch.ones(4), requires_grad=False)
    group = FlatGroup([torch.nn.Parameter(torch.zeros(3)), frozen], 0, 2, 0)
    assert group.offsets == [0, 3]
    assert group.slice == Slice(0, 2)
    assert frozen.data_ptr() != group.flat.data_ptr() and torch.equal(frozen, torch.ones(4))  # left as it was


@FAST
@given(shapes, st.integers(1, 4), st.data())
def test_the_flat_group_makes_parameters_and_gradients_views_keeping_their_values(dims, size, data):
    params = [torch.nn.Parameter(torch.randn(tuple(d))) for d in dims]
    for p in params:
        p.grad = torch.randn(p.shape)
    values, grads = [p.detach().clone() for p in params], [p.grad.clone() for p in params]
    held = list(params)
    rank = data.draw(st.integers(0, size - 1))
    g = FlatGroup(params, rank, size, 0)
    for i, p in enumerate(params):
        assert p is held[i] and torch.equal(p.detach(), values[i]) and torch.equal(p.grad, grads[i])
        assert g.holds(i, p.data, g.flat) and g.holds(i, p.grad, g.grads)
    start, stop = g.slice
    assert g.shard.numel() == stop - start and g.shard.grad.numel() == stop - start
    if stop > start:
        assert g.shard.data_ptr() == g.flat[start:].data_ptr()
        assert g.shard.grad.data_ptr() == g.grads[start:].data_ptr()


def test_backward_after_zero_grad_set_to_none_accumulates_into_the_gradient_buffer():
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    g = FlatGroup(list(model.parameters()), 0, 2, 0)
    x = torch.randn(5, 4)
    model(x).sum().backward()
    model.zero_grad(set_to_none=True)  # the module's zero_grad: the buffer is not zeroed
    assert all(p.grad is None for p in model.parameters())
    model(x).sum().backward()
    model(x).sum().backward()  # accumulates
    assert torch.equal(g.grads[:12].view(3, 4), 2 * x.sum(0).expand(3, 4))  # not the stale first gradient added
    assert all(g.holds(i, p.grad, g.grads) for i, p in enumerate(model.parameters()))


def test_prepare_zeroes_missing_gradients_and_takes_back_replaced_storage():
    model = torch.nn.Linear(2, 2)
    g = FlatGroup(list(model.parameters()), 0, 1, 0)
    g.grads.fill_(7.0)  # stale
    model.bias.data = torch.tensor([1.0, 2.0])
    model.weight.grad = torch.ones(2, 2)
    g.prepare()
    assert torch.equal(g.flat[4:], torch.tensor([1.0, 2.0])) and g.holds(1, model.bias.data, g.flat)
    assert torch.equal(g.grads, torch.tensor([1.0, 1.0, 1.0, 1.0, 0.0, 0.0]))  # the bias's None counts 0
    model.double()
    with pytest.raises(ConfigError, match=r"parameter 0 of param group 0 is now torch.float64 .* after model.to"):
        g.prepare()


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


def test_freed_heap_memory_is_handed_back_through_glibc_here():
    assert release_freed_memory() is True  # Debian's glibc has malloc_trim; elsewhere it is skipped (False)
