"""Starting Horovod for TensorFlow and asking where this process sits."""

import tensorflow as tf

from ..core import env as _env
from ..core import log as _log
from ..core.runtime import Runtime, RuntimePreemptionGuard
from ._engine import horovod_tf
from .comm import HorovodCommunicator

__all__ = ["PreemptionGuard", *Runtime.FUNCTIONS]  # init, rank, size, communicator, scaled_lr, ...

_logger = _log.get_logger("tensorflow")


def _on_start(topo, hvd, threads):
    """TensorFlow's intra-op threads per rank = cores / local size (if TensorFlow has not started yet).

    Env: HVDKIT_NUM_THREADS, else OMP_NUM_THREADS, override the default (``hvdkit.core.env.num_threads``).
    """
    n = _env.num_threads(threads, topo.local_size)
    try:
        tf.config.threading.set_intra_op_parallelism_threads(n)
        tf.config.threading.set_inter_op_parallelism_threads(max(1, min(2, n)))
    except RuntimeError:  # TensorFlow already started: its own thread settings stay
        pass
    if topo.is_rank0:
        controller = "MPI" if hvd.mpi_enabled() else "Gloo"
        _logger.info("%d rank(s) over %s; TensorFlow %s", topo.size, controller, tf.__version__)


_runtime = Runtime(horovod_tf, HorovodCommunicator, _on_start)
init, topology, communicator, average_metrics, rank, size, local_rank, local_size, is_rank0, scaled_lr = _runtime.functions()


class PreemptionGuard(RuntimePreemptionGuard):
    """``hvdkit.core.PreemptionGuard`` on this job's communicator: after SIGTERM/SIGUSR1 on any rank,
    every rank's ``should_stop()`` returns True at the same step. Collective: every rank creates it
    and calls ``should_stop()`` the same number of times. Env: HVDKIT_JOB_ID (set by ``hvdkit run``)."""

    runtime = _runtime
