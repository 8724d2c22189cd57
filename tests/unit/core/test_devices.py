"""Which GPU a rank takes (hvdkit.core.devices): pure logic, no GPU needed."""

import pytest
import torch
from gpu_jobs import per_rank_hostid_argv
from hypothesis import given
from hypothesis import strategies as st

from hvdkit.core.devices import choose_gpu, gpus_shared, shared_gpu_env
from hvdkit.core.errors import ConfigError

# torch's first optimizer step sets TORCHINDUCTOR_CACHE_DIR: take it at import, not inside a test
# (the conftest fails a test that changes the environment).
torch.optim.SGD(torch.nn.Linear(1, 1).parameters(), lr=0.1).step()


@given(st.integers(1, 16).flatmap(lambda n: st.tuples(st.just(n), st.integers(n, 16))))
def test_each_rank_takes_its_local_ranks_gpu_when_there_are_enough(sizes):
    local_size, gpus = sizes
    assert [choose_gpu(r, local_size, gpus, env={}) for r in range(local_size)] == list(range(local_size))


def test_no_gpu_or_hvdkit_device_cpu_means_the_cpu():
    assert choose_gpu(0, 2, 0, env={}) is None
    assert choose_gpu(1, 2, 4, env={"HVDKIT_DEVICE": "cpu"}) is None


def test_an_unknown_hvdkit_device_is_named():
    with pytest.raises(ConfigError, match="HVDKIT_DEVICE='tpu'"):
        choose_gpu(0, 1, 1, env={"HVDKIT_DEVICE": "tpu"})


def test_more_ranks_than_gpus_is_an_error_naming_the_counts_and_the_ways_out():
    with pytest.raises(ConfigError) as caught:
        choose_gpu(2, 4, 2, env={"CUDA_VISIBLE_DEVICES": "0,1"})
    message = str(caught.value)
    assert message.startswith("4 ranks on this host but 2 GPU(s) visible (CUDA_VISIBLE_DEVICES=0,1): rank 2")
    for fix in ("-np 2 per host", "CUDA_VISIBLE_DEVICES", "HVDKIT_SHARE_GPUS=1", "NCCL_MULTI_RANK_GPU_ENABLE=1"):
        assert fix in message


@given(st.integers(1, 8), st.integers(1, 32), st.sampled_from(["HVDKIT_SHARE_GPUS", "NCCL_MULTI_RANK_GPU_ENABLE"]))
def test_shared_gpus_go_round_robin_and_each_gets_its_share(gpus, local_size, switch):
    env = {switch: "1"}
    assert gpus_shared(env)
    picks = [choose_gpu(r, local_size, gpus, env=env) for r in range(local_size)]
    assert all(0 <= p < gpus for p in picks)
    counts = [picks.count(g) for g in range(min(gpus, local_size))]
    assert max(counts) - min(counts) <= 1


def test_nccl_230_shares_a_gpu_with_its_switch_and_older_nccl_by_a_host_id_per_rank():
    env, per_rank = shared_gpu_env((2, 30, 7))
    assert env == {"HVDKIT_SHARE_GPUS": "1", "NCCL_MULTI_RANK_GPU_ENABLE": "1"} and not per_rank
    env, per_rank = shared_gpu_env((2, 28, 9))
    assert per_rank and env["NCCL_SOCKET_IFNAME"] == "lo" and "NCCL_MULTI_RANK_GPU_ENABLE" not in env


def test_the_per_rank_host_id_comes_from_the_launchers_rank(tmp_path):
    import subprocess

    argv = per_rank_hostid_argv(["sh", "-c", 'printf %s "$NCCL_HOSTID"'])
    for var, value in (("HOROVOD_RANK", "3"), ("OMPI_COMM_WORLD_RANK", "5"), ("RANK", "7")):
        out = subprocess.run(
            argv, env={"PATH": "/usr/bin:/bin", var: value}, capture_output=True, text=True, check=True
        )
        assert out.stdout == f"hvdkit-rank-{value}"


def test_compression_auto_times_the_collectives_on_the_gradients_device():
    """On a GPU job, "auto" must time NCCL on CUDA tensors, not Gloo on CPU copies ("meta" stands in for a GPU)."""
    from hvdkit.torch.autocompress import _device

    on_meta = torch.nn.Linear(2, 2, device="meta")
    assert _device(on_meta).type == "meta"
    assert _device(torch.optim.SGD(on_meta.parameters(), lr=0.1)).type == "meta"
    assert _device([torch.zeros(2, device="meta")]).type == "meta"
    assert _device([(2, 3)]).type == "cpu" and _device(torch.nn.Linear(2, 2)).type == "cpu"


def test_a_rank_trains_on_a_gpu_where_one_is_visible_unless_hvdkit_device_says_cpu():
    from hvdkit.core.devices import trains_on_gpu

    assert trains_on_gpu(1, {}) and trains_on_gpu(8, {"HVDKIT_DEVICE": "gpu"})
    assert not trains_on_gpu(0, {}) and not trains_on_gpu(2, {"HVDKIT_DEVICE": "cpu"})
