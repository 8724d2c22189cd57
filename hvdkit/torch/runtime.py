"""Starting Horovod for PyTorch and asking where this process sits."""

import torch

from ..core import env as _env
from ..core.runtime import Runtime, RuntimePreemptionGuard
from ._engine import horovod_torch
from .comm import HorovodCommunicator

__all__ = ["PreemptionGuard", *Runtime.FUNCTIONS]  # init, rank, size, communicator, scaled_lr, ...


def _on_start(topo, threads):
    """Intra-op threads per rank = cores / local size, so ranks sharing a host do not oversubscribe it.

    Env: HVDKIT_NUM_THREADS, else OMP_NUM_THREADS, override the default (``hvdkit.core.env.num_threads``).
    """
    torch.set_num_threads(_env.num_threads(threads, topo.local_size))
    return f"torch {torch.__version__}, {torch.get_num_threads()} thread(s) per rank"


_runtime = Runtime(horovod_torch, HorovodCommunicator, _on_start, "torch")
init, topology, communicator, average_metrics, rank, size, local_rank, local_size, is_rank0, scaled_lr = _runtime.functions()


class PreemptionGuard(RuntimePreemptionGuard):
    """``hvdkit.core.PreemptionGuard`` on the torch job's communicator (``RuntimePreemptionGuard`` says how it behaves)."""

    runtime = _runtime
