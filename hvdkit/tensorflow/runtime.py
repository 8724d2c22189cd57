"""Starting Horovod for TensorFlow and asking where this process sits."""

import tensorflow as tf

from ..core import env as _env
from ..core.devices import choose_gpu
from ..core.errors import ConfigError
from ..core.runtime import Runtime, RuntimePreemptionGuard
from ._engine import horovod_tf
from .comm import HorovodCommunicator

__all__ = ["PreemptionGuard", *Runtime.FUNCTIONS]  # init, rank, size, communicator, scaled_lr, ...


def _unpinned_gpu_note(index, local_rank, local_size, gpu_count):
    """The start line's note when TensorFlow had started its GPUs before ``init()`` (pinning failed).

    One rank on the host: a note (it sees every GPU and TensorFlow puts its work on the first, ``index``
    being 0). Several: ConfigError, since each of them would work on GPU 0 and hold memory on all
    ``gpu_count`` GPUs, so the ranks share one GPU and run out of its memory. No collective; every
    rank of a host decides alike (the same program started TensorFlow alike).
    """
    if local_size == 1:
        return f"; TensorFlow had started its GPUs before init(): all {gpu_count} visible (call hk.init() first)"
    raise ConfigError(
        f"TensorFlow had started its GPUs before hk.init(), so rank {local_rank} of the {local_size} on this host "
        f"could not be given GPU {index} alone: every rank would use GPU 0 and hold memory on all {gpu_count}. "
        "Call hk.init() before any TensorFlow op or tf.config call that starts the GPUs (making a tensor, a model "
        "or a dataset, tf.config.list_logical_devices, set_memory_growth)"
    )


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
        return _unpinned_gpu_note(index, topo.local_rank, topo.local_size, len(gpus))
    return f"; GPU {index} per rank of {len(gpus)}"


def _on_start(topo, threads):
    """Pin the rank to its GPU (``local_rank``'s, memory growth on) where there are GPUs; TensorFlow's
    intra-op threads per rank = cores / local size (if TensorFlow has not started yet). ConfigError
    when TensorFlow had started its GPUs already and the host has several ranks (``_unpinned_gpu_note``).

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
