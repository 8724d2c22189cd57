"""Starting Horovod for PyTorch and asking where this process sits."""

import os

import torch

from ..core import env as _env
from ..core import log as _log
from ..core.topology import Topology
from ._engine import horovod_torch
from .comm import HorovodCommunicator

__all__ = ["init", "topology", "communicator", "rank", "size", "local_rank", "local_size", "is_rank0"]

_state = {"comm": None}
_logger = _log.get_logger("torch")


def init(threads=None):
    """Start Horovod (once) and return this process's Topology.

    Also sets hvdkit's rank-prefixed logging and the intra-op threads of each rank to
    cores / local size, so ranks sharing a host do not oversubscribe it.
    Collective: every rank calls it.
    Env: HVDKIT_NUM_THREADS, OMP_NUM_THREADS (either overrides the thread default), HVDKIT_LOG_LEVEL.
    """
    hvd = horovod_torch()
    if not hvd.is_initialized():
        hvd.init()
    topo = topology()
    _log.set_topology(topo)
    _log.configure()
    _set_threads(threads, topo)
    if topo.is_rank0 and _state["comm"] is None:
        controller = "MPI" if hvd.mpi_enabled() else "Gloo"
        _logger.info(
            "%d rank(s) over %s; torch %s, %d thread(s) per rank",
            topo.size,
            controller,
            torch.__version__,
            torch.get_num_threads(),
        )
    _state["comm"] = HorovodCommunicator()
    return topo


def _set_threads(threads, topo):
    explicit = threads or os.environ.get(_env.NUM_THREADS)
    if explicit:
        torch.set_num_threads(int(explicit))
    elif "OMP_NUM_THREADS" not in os.environ:
        cores = len(os.sched_getaffinity(0))
        torch.set_num_threads(max(1, cores // topo.local_size))


def topology():
    """This process's Topology (needs ``init()``)."""
    hvd = horovod_torch()
    return Topology(hvd.rank(), hvd.size(), hvd.local_rank(), hvd.local_size())


def communicator():
    """The core communicator for this job (calls ``init()`` if needed)."""
    if _state["comm"] is None:
        init()
    return _state["comm"]


def rank():
    return horovod_torch().rank()


def size():
    return horovod_torch().size()


def local_rank():
    return horovod_torch().local_rank()


def local_size():
    return horovod_torch().local_size()


def is_rank0():
    return rank() == 0
