"""The core's communicator interface over horovod.tensorflow (eager mode)."""

import tensorflow as tf

from ..core.comm import HorovodCommunicatorBase
from ._engine import horovod_tf

__all__ = ["HorovodCommunicator"]


class HorovodCommunicator(HorovodCommunicatorBase):
    """Collectives over ``horovod.tensorflow``."""

    def __init__(self):
        super().__init__(horovod_tf())

    def allreduce_sum(self, values, name):
        tensor = tf.constant([float(v) for v in values], dtype=tf.float64)
        return self._hvd.allreduce(tensor, op=self._hvd.Sum, name=name).numpy().tolist()
