"""Starting Horovod for TensorFlow and asking where this process sits."""

import tensorflow as tf

from ..core import env as _env
from ..core.devices import choose_gpu
from ..core.runtime import Runtime, RuntimePreemptionGuard
from ._engine import horovod_tf
from .comm import HorovodCommunicator

__all__ = ["PreemptionGuard", *Runtime.FUNCTIONS]  # init, rank, size, communicator, scaled_lr, ...


def _pin_gpu(topo):
    """Make only this rank's GPU (``local_rank``'s) visible to TensorFlow, with memory growth; a note or ''."""
    gpus = tf.config.list_physical_devices("GPU")
    index = choose_gpu(topo.local_rank, topo.local_size, len(gpus))
    if index is None:
        return ""
    try:
        tf.config.set_visible_devices(gpus[index], "GPU")
        tf.config.experimental.set_memory_growth(gpus[index], True)
    except RuntimeError:  # TensorFlow already started its devices: they stay as they are
        return f"; TensorFlow had started its GPUs before init(): call hk.init() first to get GPU {index} alone"
    return f"; GPU {index} per rank of {len(gpus)}"


def _on_start(topo, threads):
    """Pin the rank to its GPU (``local_rank``'s, memory growth on) where there are GPUs; TensorFlow's
    intra-op threads per rank = cores / local size (if TensorFlow has not started yet).

    Env: HVDKIT_NUM_THREADS, else OMP_NUM_THREADS, override the default (``hvdkit.core.env.num_threads``);
    CUDA_VISIBLE_DEVICES, HVDKIT_DEVICE=cpu, HVDKIT_SHARE_GPUS (``hvdkit.core.devices``).
    """
    gpu = _pin_gpu(topo)
    n = _env.num_threads(threads, topo.local_size)
    try:
        tf.config.threading.set_intra_op_parallelism_threads(n)
        tf.config.threading.set_inter_op_parallelism_threads(max(1, min(2, n)))
    except RuntimeError:  # TensorFlow already started: its own thread settings stay
        pass
    return f"TensorFlow {tf.__version__}{gpu}"


_runtime = Runtime(horovod_tf, HorovodCommunicator, _on_start, "tensorflow")
init, topology, communicator, average_metrics, rank, size, local_rank, local_size, is_rank0, scaled_lr = (
    _runtime.functions()
)


class PreemptionGuard(RuntimePreemptionGuard):
    """``hvdkit.core.PreemptionGuard`` on the TensorFlow job's communicator.

    How it behaves: ``hvdkit.core.runtime.RuntimePreemptionGuard``.
    """

    runtime = _runtime
