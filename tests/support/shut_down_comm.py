"""A size-1 communicator that can act as Horovod does after ``hvd.shutdown()`` (an in-process reset, the exit)."""

import threading

from hvdkit.core import LocalCommunicator


class ShutDownLater(LocalCommunicator):
    """A size-1 communicator that, while ``down``, raises what Horovod's ``rank()``/``size()`` raise after
    ``hvd.shutdown()``; it records the name of every thread that used it."""

    def __init__(self):
        self.down, self.users = False, []

    def _use(self, value):
        self.users.append(threading.current_thread().name)
        if self.down:
            raise ValueError("Horovod has not been initialized; use hvd.init().")
        return value

    rank = property(lambda self: self._use(0))
    size = property(lambda self: self._use(1))

    def broadcast_object(self, obj, name, root=0):
        return self._use(super().broadcast_object(obj, name, root))

    def allgather_object(self, obj, name):
        return self._use(super().allgather_object(obj, name))

    def allreduce_sum(self, values, name):
        return self._use(super().allreduce_sum(values, name))

    def barrier(self):
        self._use(None)
