"""Which accelerator a rank uses: one GPU per rank, picked by its local rank (framework-free logic).

The adapters ask ``choose_gpu`` at ``init()`` with the number of GPUs the framework sees (after
``CUDA_VISIBLE_DEVICES``) and pin the rank to the answer (torch ``cuda.set_device``, TensorFlow
visible devices). More ranks on a host than GPUs is an error, unless sharing is asked for: NCCL
refuses two ranks on one GPU ("Duplicate GPU detected") before 2.30, and from 2.30 allows it only
with ``NCCL_MULTI_RANK_GPU_ENABLE=1``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

from .errors import ConfigError

__all__ = ["choose_gpu", "gpus_shared", "shared_gpu_env", "trains_on_gpu", "wants_cpu"]

_TRUE = ("1", "true", "yes", "on")


def wants_cpu(env: Mapping[str, str] | None = None) -> bool:
    """True when ``HVDKIT_DEVICE=cpu`` asks for CPU training on a host that has GPUs."""
    env = os.environ if env is None else env
    value = env.get("HVDKIT_DEVICE", "").strip().lower()
    if value not in ("", "cpu", "gpu", "cuda", "auto"):
        raise ConfigError(f"HVDKIT_DEVICE={value!r} is not cpu, gpu or auto; unset it to use a GPU where there is one")
    return value == "cpu"


def trains_on_gpu(gpu_count: int, env: Mapping[str, str] | None = None) -> bool:
    """True when a rank on a host with ``gpu_count`` visible GPUs will train on one (known before Horovod
    starts: ``choose_gpu`` then picks which); False with no GPU or ``HVDKIT_DEVICE=cpu``."""
    return gpu_count > 0 and not wants_cpu(env)


def gpus_shared(env: Mapping[str, str] | None = None) -> bool:
    """True when ranks may share GPUs: ``HVDKIT_SHARE_GPUS=1`` or NCCL's ``NCCL_MULTI_RANK_GPU_ENABLE=1``."""
    env = os.environ if env is None else env
    return any(
        env.get(name, "").strip().lower() in _TRUE for name in ("HVDKIT_SHARE_GPUS", "NCCL_MULTI_RANK_GPU_ENABLE")
    )


def choose_gpu(local_rank: int, local_size: int, gpu_count: int, env: Mapping[str, str] | None = None) -> int | None:
    """The GPU index for the rank ``local_rank`` of ``local_size`` on a host with ``gpu_count`` visible
    GPUs: ``local_rank`` itself; None where there is no GPU (or ``HVDKIT_DEVICE=cpu``).

    Raises ConfigError, naming the counts and the three ways out, when the host's ranks outnumber
    its GPUs and sharing was not asked for (``gpus_shared``); shared, ranks go round-robin.
    """
    if not trains_on_gpu(gpu_count, env):
        return None
    env = os.environ if env is None else env
    if local_size > gpu_count:
        if not gpus_shared(env):
            visible = env.get("CUDA_VISIBLE_DEVICES")
            raise ConfigError(
                f"{local_size} ranks on this host but {gpu_count} GPU(s) visible"
                f"{f' (CUDA_VISIBLE_DEVICES={visible})' if visible is not None else ''}: rank {local_rank} has no GPU "
                f"of its own. Start one rank per GPU (-np {gpu_count} per host), make more GPUs visible "
                "(CUDA_VISIBLE_DEVICES), or let ranks share GPUs with HVDKIT_SHARE_GPUS=1 "
                "(NCCL >= 2.30 also needs NCCL_MULTI_RANK_GPU_ENABLE=1; older NCCL refuses two ranks on one GPU); "
                "HVDKIT_DEVICE=cpu trains on the CPU instead"
            )
        return local_rank % gpu_count
    return local_rank


def shared_gpu_env(nccl_version: Sequence[int]) -> tuple[dict[str, str], bool]:
    """Environment for several ranks on one GPU (tests, benchmarks, a one-GPU workstation); ``(env, per_rank)``.

    NCCL >= 2.30 (``nccl_version`` a tuple) allows it with ``NCCL_MULTI_RANK_GPU_ENABLE=1``. Older NCCL
    refuses two ranks whose host and GPU match; with ``per_rank`` True every rank must also get its
    own ``NCCL_HOSTID`` (``HVDKIT_PER_RANK_HOSTID=1`` asks the benchmark and doctor ranks to set it),
    so that NCCL treats the ranks as separate hosts and connects them over sockets on loopback:
    slower than one GPU per rank, correct all the same.
    """
    env = {"HVDKIT_SHARE_GPUS": "1"}
    if tuple(nccl_version) >= (2, 30):
        env["NCCL_MULTI_RANK_GPU_ENABLE"] = "1"
        return env, False
    env.update(
        {
            "NCCL_SOCKET_IFNAME": "lo",
            "NCCL_IB_DISABLE": "1",
            "NCCL_P2P_DISABLE": "1",
            "NCCL_SHM_DISABLE": "1",
            "NCCL_NVLS_ENABLE": "0",
        }
    )
    return env, True
