"""Starting Horovod for TensorFlow and asking where this process sits."""

import os

import tensorflow as tf

from ..core import env as _env
from ..core import log as _log
from ..core.topology import Topology
from ._engine import horovod_tf
from .comm import HorovodCommunicator

__all__ = ["init", "topology", "communicator", "rank", "size", "local_rank", "local_size", "is_rank0"]

_state = {"comm": None}
_logger = _log.get_logger("tensorflow")


def init(threads=None):
    """Start Horovod (once) and return this process's Topology.

    Also sets hvdkit's rank-prefixed logging and TensorFlow's intra-op threads per rank to
    cores / local size (when TensorFlow has not started yet), so ranks sharing a host do not
    oversubscribe it.
    Collective: every rank calls it.
    Env: HVDKIT_NUM_THREADS, OMP_NUM_THREADS (either overrides the thread default), HVDKIT_LOG_LEVEL.
    """
    hvd = horovod_tf()
    first = _state["comm"] is None
    if first:
        hvd.init()
    topo = topology()
    _log.set_topology(topo)
    _log.configure()
    if first:
        _set_threads(threads, topo)
        _state["comm"] = HorovodCommunicator()
        if topo.is_rank0:
            _logger.info(
                "%d rank(s) over %s; TensorFlow %s", topo.size, "MPI" if hvd.mpi_enabled() else "Gloo", tf.__version__
            )
    return topo


def _set_threads(threads, topo):
    explicit = threads or os.environ.get(_env.NUM_THREADS) or os.environ.get("OMP_NUM_THREADS")
    n = int(explicit) if explicit else max(1, len(os.sched_getaffinity(0)) // topo.local_size)
    try:
        tf.config.threading.set_intra_op_parallelism_threads(n)
        tf.config.threading.set_inter_op_parallelism_threads(max(1, min(2, n)))
    except RuntimeError:  # TensorFlow already started: its own thread settings stay
        pass


def topology():
    """This process's Topology (needs ``init()``)."""
    hvd = horovod_tf()
    return Topology(hvd.rank(), hvd.size(), hvd.local_rank(), hvd.local_size())


def communicator():
    """The core communicator for this job (calls ``init()`` if needed)."""
    if _state["comm"] is None:
        init()
    return _state["comm"]


def rank():
    return horovod_tf().rank()


def size():
    return horovod_tf().size()


def local_rank():
    return horovod_tf().local_rank()


def local_size():
    return horovod_tf().local_size()


def is_rank0():
    return rank() == 0
