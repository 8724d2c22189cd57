"""``hvdkit.torch.buckets``: the bucket plan (pure logic on parameter shapes, no collective)."""

import pytest
import torch

from hvdkit.core.errors import ConfigError
from hvdkit.torch.buckets import AUTO_GPU_BUCKET_MB, check_bucket_mb, plan_buckets, resolve_bucket_mb

MB = 1 << 20


def _params(*numels, dtype=torch.float32):
    return [torch.nn.Parameter(torch.zeros(n, dtype=dtype)) for n in numels]


def _where(params, buckets):
    """Each bucket as the indices of its parameters in ``params`` (by identity)."""
    return [[next(i for i, q in enumerate(params) if q is p) for p in b] for b in buckets]


def _sizes(buckets):
    return [sum(p.numel() * p.element_size() for p in b) for b in buckets]


def test_the_first_bucket_closes_at_one_mib_and_the_others_at_bucket_mb():
    # registered first = produced last by backward: the plan walks them reversed
    params = _params(3 * MB // 4, 5 * MB // 4, MB // 16, MB // 8, MB // 4)  # 3, 5, 1/4, 1/2, 1 MiB
    buckets = plan_buckets([{"params": params}], bucket_mb=2)
    assert _where(params, buckets) == [[4], [3, 2, 1], [0]]
    assert _sizes(buckets) == [MB, MB // 2 + MB // 4 + 5 * MB, 3 * MB]


def test_frozen_parameters_are_left_out_and_a_large_one_gets_a_bucket_of_its_own():
    params = _params(10 * MB // 4, 4, 4)
    params[1].requires_grad_(False)
    buckets = plan_buckets([{"params": params[:2]}, {"params": params[2:]}], bucket_mb=1, first_mb=1)
    assert _where(params, buckets) == [[2, 0]]
    buckets = plan_buckets([{"params": params}], bucket_mb=1, first_mb=1e-6)
    assert _where(params, buckets) == [[2], [0]]


def test_parameters_of_another_dtype_fill_a_bucket_of_their_own():
    params = _params(4, 4) + _params(4, dtype=torch.float16) + _params(4)
    buckets = plan_buckets([{"params": params}], bucket_mb=1)
    assert _where(params, buckets) == [[3, 1, 0], [2]]


@pytest.mark.parametrize("value,expected", [(None, None), (0, None), (25, 25.0), (0.5, 0.5)])
def test_bucket_mb_none_or_zero_is_off(value, expected):
    assert check_bucket_mb(value) == expected


@pytest.mark.parametrize("value", [-1, float("nan"), float("inf"), True, "25"])
def test_a_bad_bucket_mb_is_a_config_error_naming_it(value):
    with pytest.raises(ConfigError, match=r"bucket_mb must be a number of MiB > 0.*got"):
        check_bucket_mb(value)


def test_auto_buckets_like_ddp_where_the_parameters_are_on_a_gpu_and_not_on_the_cpu():
    # "auto" (hk.DistributedOptimizer's default): DDP's 25 MiB where a trainable parameter is on CUDA
    # (measured 1.04-1.05x DDP's step on an H200, docs/gpu.md); no buckets on the CPU, as measured there.
    cpu, cuda = torch.device("cpu"), torch.device("cuda", 0)
    assert resolve_bucket_mb("auto", [cpu, cpu]) is None
    assert resolve_bucket_mb("auto", [cpu, cuda]) == AUTO_GPU_BUCKET_MB == 25.0
    assert resolve_bucket_mb("auto", []) is None
    assert resolve_bucket_mb("auto", [cuda], sparse=True) is None  # sparse gradients take Horovod's own path
    assert resolve_bucket_mb(None, [cuda]) is None and resolve_bucket_mb(0, [cuda]) is None
    assert resolve_bucket_mb(4, [cpu]) == 4.0


def test_a_bad_bucket_mb_string_names_the_value_and_auto():
    with pytest.raises(ConfigError, match=r"bucket_mb.*'fast'.*\"auto\""):
        resolve_bucket_mb("fast", [torch.device("cpu")])
