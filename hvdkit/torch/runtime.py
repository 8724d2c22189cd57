"""Starting Horovod for PyTorch and asking where this process sits."""

import torch

from ..core import env as _env
from ..core import log as _log
from ..core.runtime import Runtime, RuntimePreemptionGuard
from ._engine import horovod_torch
from .comm import HorovodCommunicator

__all__ = ["PreemptionGuard", *Runtime.FUNCTIONS]  # init, rank, size, communicator, scaled_lr, ...

_logger = _log.get_logger("torch")


def _on_start(topo, hvd, threads):
    """Intra-op threads per rank = cores / local size, so ranks sharing a host do not oversubscribe it.

    Env: HVDKIT_NUM_THREADS, else OMP_NUM_THREADS, override the default (``hvdkit.core.env.num_threads``).
    """
    torch.set_num_threads(_env.num_threads(threads, topo.local_size))
    if topo.is_rank0:
        controller = "MPI" if hvd.mpi_enabled() else "Gloo"
        _logger.info("%d rank(s) over %s; torch %s, %d thread(s) per rank", topo.size, controller, torch.__version__, torch.get_num_threads())


_runtime = Runtime(horovod_torch, HorovodCommunicator, _on_start)
init, topology, communicator, average_metrics, rank, size, local_rank, local_size, is_rank0, scaled_lr = _runtime.functions()


class PreemptionGuard(RuntimePreemptionGuard):
    """``hvdkit.core.PreemptionGuard`` on this job's communicator: after SIGTERM/SIGUSR1 on any rank,
    every rank's ``should_stop()`` returns True at the same step. Collective: every rank creates it
    and calls ``should_stop()`` the same number of times. Env: HVDKIT_JOB_ID (set by ``hvdkit run``)."""

    runtime = _runtime
