"""The core's communicator interface over horovod.torch."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ..core.comm import CHUNK_BYTES, HorovodCommunicatorBase
from ._engine import horovod_torch

__all__ = ["HorovodCommunicator"]


class HorovodCommunicator(HorovodCommunicatorBase):
    """Collectives over ``horovod.torch``."""

    def __init__(self) -> None:
        super().__init__(horovod_torch(), lambda values: torch.tensor(values, dtype=torch.float64))

    def broadcast_tensors(self, tensors: Sequence[torch.Tensor], name: str, root: int = 0) -> None:
        """Overwrite each of ``tensors`` in place with ``root``'s, bitwise (see ``Communicator``).

        Each tensor is viewed as flat bytes and sent in slices of at most ``CHUNK_BYTES`` with
        Horovod's in-place broadcast; at most ``CHUNK_BYTES`` are in flight, so small tensors share
        one round and a big one costs no copy (a non-contiguous tensor costs one contiguous copy).
        Collective: every rank calls it with tensors of the same shapes and dtypes; the collective
        names are ``name``, the tensor's index and the slice's index.
        """
        pending, in_flight = [], 0
        for i, tensor in enumerate(tensors):
            target = tensor.detach()
            work = target if target.is_contiguous() else target.contiguous()
            flat = work.reshape(-1).view(torch.uint8)
            for j, start in enumerate(range(0, flat.numel(), CHUNK_BYTES)):
                part = flat[start : start + CHUNK_BYTES]
                if in_flight + part.numel() > CHUNK_BYTES:
                    in_flight = self._wait(pending)
                pending.append(self._hvd.broadcast_async_(part, root, name=f"{name}.{i}.{j}"))
                in_flight += part.numel()
            if work is not target:
                in_flight = self._wait(pending)
                target.copy_(work)
        self._wait(pending)

    def _wait(self, handles):
        for handle in handles:
            self._hvd.synchronize(handle)
        handles.clear()
        return 0
