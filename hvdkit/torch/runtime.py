"""Starting Horovod for PyTorch and asking where this process sits."""

from __future__ import annotations

import torch

from ..core import env as _env
from ..core.devices import choose_gpu, trains_on_gpu
from ..core.runtime import Runtime, RuntimePreemptionGuard
from ._engine import horovod_torch
from .comm import HorovodCommunicator

__all__ = ["PreemptionGuard", "device", *Runtime.FUNCTIONS]  # init, rank, size, communicator, scaled_lr, ...

_device = None


def _on_start(topo, threads):
    """Pin the rank to its GPU (``local_rank``'s, ``hvdkit.core.devices.choose_gpu``) where there are
    GPUs; intra-op threads per rank = cores / local size, so ranks sharing a host do not oversubscribe it.

    Env: HVDKIT_NUM_THREADS, else OMP_NUM_THREADS, override the default (``hvdkit.core.env.num_threads``);
    CUDA_VISIBLE_DEVICES, HVDKIT_DEVICE=cpu, HVDKIT_SHARE_GPUS (``hvdkit.core.devices``).
    """
    global _device
    index = choose_gpu(topo.local_rank, topo.local_size, torch.cuda.device_count() if torch.cuda.is_available() else 0)
    torch.set_num_threads(_env.num_threads(threads, topo.local_size))
    detail = f"torch {torch.__version__}, {torch.get_num_threads()} thread(s) per rank"
    if index is None:
        _device = torch.device("cpu")
        return detail
    torch.cuda.set_device(index)
    _device = torch.device("cuda", index)
    shared = " (shared by ranks)" if topo.local_size > torch.cuda.device_count() else ""
    return f"{detail}; GPU {index}{shared} per rank of {torch.cuda.device_count()}: {torch.cuda.get_device_name(index)}"


def _on_gpu() -> bool:
    """Whether this rank will train on a GPU (asked before Horovod starts, for its GPU settings)."""
    return trains_on_gpu(torch.cuda.device_count() if torch.cuda.is_available() else 0)


_runtime = Runtime(horovod_torch, HorovodCommunicator, _on_start, "torch", on_gpu=_on_gpu)
init, topology, communicator, average_metrics, rank, size, local_rank, local_size, is_rank0, scaled_lr = (
    _runtime.functions()
)


def device() -> torch.device:
    """This rank's ``torch.device``: ``cuda:<local_rank>`` where the host has GPUs, else ``cpu``.

    Calls ``init()`` if needed.
    Move the model there before wrapping the optimizer: ``model.to(hk.device())``.
    """
    _runtime.communicator()  # starts the job once
    return _device


class PreemptionGuard(RuntimePreemptionGuard):
    """``hvdkit.core.PreemptionGuard`` on the torch job's communicator.

    How it behaves: ``hvdkit.core.runtime.RuntimePreemptionGuard``.
    """

    runtime = _runtime
