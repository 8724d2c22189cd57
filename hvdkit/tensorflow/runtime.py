"""Starting Horovod for TensorFlow and asking where this process sits."""

import tensorflow as tf

from ..core import env as _env
from ..core.runtime import Runtime, RuntimePreemptionGuard
from ._engine import horovod_tf
from .comm import HorovodCommunicator

__all__ = ["PreemptionGuard", *Runtime.FUNCTIONS]  # init, rank, size, communicator, scaled_lr, ...


def _on_start(topo, threads):
    """TensorFlow's intra-op threads per rank = cores / local size (if TensorFlow has not started yet).

    Env: HVDKIT_NUM_THREADS, else OMP_NUM_THREADS, override the default (``hvdkit.core.env.num_threads``).
    """
    n = _env.num_threads(threads, topo.local_size)
    try:
        tf.config.threading.set_intra_op_parallelism_threads(n)
        tf.config.threading.set_inter_op_parallelism_threads(max(1, min(2, n)))
    except RuntimeError:  # TensorFlow already started: its own thread settings stay
        pass
    return f"TensorFlow {tf.__version__}"


_runtime = Runtime(horovod_tf, HorovodCommunicator, _on_start, "tensorflow")
init, topology, communicator, average_metrics, rank, size, local_rank, local_size, is_rank0, scaled_lr = _runtime.functions()


class PreemptionGuard(RuntimePreemptionGuard):
    """``hvdkit.core.PreemptionGuard`` on the TensorFlow job's communicator (``RuntimePreemptionGuard`` says how it behaves)."""

    runtime = _runtime
