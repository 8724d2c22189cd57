"""The core's communicator interface over horovod.tensorflow (eager mode)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import tensorflow as tf

from ..core.comm import CHUNK_BYTES, HorovodCommunicatorBase
from ._engine import horovod_tf

if TYPE_CHECKING:
    import numpy as np

__all__ = ["HorovodCommunicator"]


class HorovodCommunicator(HorovodCommunicatorBase):
    """Collectives over ``horovod.tensorflow``."""

    def __init__(self) -> None:
        super().__init__(horovod_tf(), lambda values: tf.constant(values, dtype=tf.float64))

    def broadcast_tensors(self, tensors: Sequence[np.ndarray], name: str, root: int = 0) -> None:
        """Overwrite each of ``tensors`` (writable C-contiguous numpy arrays) with ``root``'s, bitwise.

        Each array is viewed as flat bytes and sent in slices of at most ``CHUNK_BYTES``; a slice
        received is copied into the array, so the extra memory is about two slices.
        Collective: every rank calls it with arrays of the same shapes and dtypes; the collective
        names are ``name``, the array's index and the slice's index.
        """
        is_root = self.rank == root
        for i, array in enumerate(tensors):
            if not array.flags.c_contiguous or not (is_root or array.flags.writeable):
                raise ValueError(
                    f"broadcast_tensors needs C-contiguous arrays, writable off the root (array {i} is not)"
                )
            flat = array.reshape(-1).view("uint8")  # a view: reshape of a contiguous array copies nothing
            for j, start in enumerate(range(0, flat.size, CHUNK_BYTES)):
                part = flat[start : start + CHUNK_BYTES]
                got = self._hvd.broadcast(tf.constant(part), root, name=f"{name}.{i}.{j}")
                if not is_root:
                    part[...] = got.numpy()
