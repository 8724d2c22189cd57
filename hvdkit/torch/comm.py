"""The core's communicator interface over horovod.torch."""

import torch

from ..core.comm import HorovodCommunicatorBase
from ._engine import horovod_torch

__all__ = ["HorovodCommunicator"]


class HorovodCommunicator(HorovodCommunicatorBase):
    """Collectives over ``horovod.torch``."""

    def __init__(self):
        super().__init__(horovod_torch())

    def allreduce_sum(self, values, name):
        tensor = torch.tensor([float(v) for v in values], dtype=torch.float64)
        return self._hvd.allreduce(tensor, op=self._hvd.Sum, name=name).tolist()
