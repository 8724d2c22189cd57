"""The core's communicator interface over horovod.tensorflow."""

import tensorflow as tf

from ..core.comm import Communicator
from ._engine import horovod_tf

__all__ = ["HorovodCommunicator"]


class HorovodCommunicator(Communicator):
    """Collectives over Horovod (MPI or Gloo, whichever the job was started with). Eager mode."""

    def __init__(self):
        self._hvd = horovod_tf()

    @property
    def rank(self):
        return self._hvd.rank()

    @property
    def size(self):
        return self._hvd.size()

    def allreduce_sum(self, values, name):
        tensor = tf.constant([float(v) for v in values], dtype=tf.float64)
        return self._hvd.allreduce(tensor, op=self._hvd.Sum, name=name).numpy().tolist()

    def broadcast_object(self, obj, name, root=0):
        return self._hvd.broadcast_object(obj, root_rank=root, name=name)

    def allgather_object(self, obj, name):
        return self._hvd.allgather_object(obj, name=name)

    def barrier(self):
        self._hvd.barrier()
