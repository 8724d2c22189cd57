"""The small communicator interface the framework-free core talks to other ranks through.

The framework adapters implement it over Horovod; ``LocalCommunicator`` is the size-1 version
for single-process use and tests.
"""

from __future__ import annotations

import abc
import copy
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

__all__ = ["Communicator", "LocalCommunicator", "HorovodCommunicatorBase"]

CHUNK_BYTES = 64 * 2**20  # the most bytes one tensor broadcast sends (and holds in flight) at once


class Communicator(abc.ABC):
    """Collectives over numbers and Python objects.

    Collective: every method except the properties must be called by every rank, in the same
    order, with the same ``name``. Names are fixed by hvdkit, never derived from values.
    """

    @property
    @abc.abstractmethod
    def rank(self) -> int: ...

    @property
    @abc.abstractmethod
    def size(self) -> int: ...

    @property
    def is_rank0(self) -> bool:
        return self.rank == 0

    @abc.abstractmethod
    def allreduce_sum(self, values: Sequence[float], name: str) -> list[float]:
        """Element-wise float64 sum of ``values`` (a sequence of numbers) over all ranks."""

    @abc.abstractmethod
    def broadcast_object(self, obj: Any, name: str, root: int = 0) -> Any:
        """``root``'s ``obj`` on every rank (what other ranks pass is ignored)."""

    @abc.abstractmethod
    def allgather_object(self, obj: Any, name: str) -> list[Any]:
        """The list of every rank's ``obj``, indexed by rank."""

    @abc.abstractmethod
    def barrier(self) -> None:
        """Return once every rank has called it."""

    def broadcast_tensors(self, tensors: Sequence[Any], name: str, root: int = 0) -> None:
        """Overwrite each of ``tensors`` in place with ``root``'s, bitwise.

        ``tensors`` are the framework's writable buffers (torch tensors, or numpy arrays for
        TensorFlow), of the same shapes and dtypes on every rank. They travel as bytes in chunks
        of at most ``CHUNK_BYTES``, so the extra memory stays bounded whatever their size.
        """
        raise NotImplementedError(f"{type(self).__name__} cannot broadcast tensors")


class LocalCommunicator(Communicator):
    """The communicator of a job of one process."""

    rank = 0
    size = 1

    def allreduce_sum(self, values: Sequence[float], name: str) -> list[float]:
        return [float(v) for v in values]

    def broadcast_object(self, obj: Any, name: str, root: int = 0) -> Any:
        return copy.deepcopy(obj)

    def allgather_object(self, obj: Any, name: str) -> list[Any]:
        return [copy.deepcopy(obj)]

    def barrier(self) -> None:
        pass

    def broadcast_tensors(self, tensors: Sequence[Any], name: str, root: int = 0) -> None:
        pass  # the only rank is the root: its tensors already hold the values


class HorovodCommunicatorBase(Communicator):
    """Collectives over a Horovod framework module (MPI or Gloo, whichever the job started with).

    ``horovod.torch`` and ``horovod.tensorflow`` share the object collectives and the sum of numbers;
    a subclass hands in its Horovod module and ``float64(values)``, which makes its framework's
    float64 tensor of a list of floats, and adds ``broadcast_tensors``.
    """

    def __init__(self, hvd: ModuleType, float64: Callable[[list[float]], Any]) -> None:
        self._hvd = hvd
        self._float64 = float64

    def allreduce_sum(self, values: Sequence[float], name: str) -> list[float]:
        import numpy as np  # here, not at the top: ``hvdkit run`` imports the core and starts faster without numpy

        summed = self._hvd.allreduce(self._float64([float(v) for v in values]), op=self._hvd.Sum, name=name)
        return np.asarray(summed).tolist()

    @property
    def rank(self) -> int:
        return self._hvd.rank()

    @property
    def size(self) -> int:
        return self._hvd.size()

    def broadcast_object(self, obj: Any, name: str, root: int = 0) -> Any:
        return self._hvd.broadcast_object(obj, root_rank=root, name=name)

    def allgather_object(self, obj: Any, name: str) -> list[Any]:
        return self._hvd.allgather_object(obj, name=name)

    def barrier(self) -> None:
        self._hvd.barrier()
