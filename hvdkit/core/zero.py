"""ZeRO-1's partition arithmetic, shared by ``hvdkit.torch.zero`` and ``hvdkit.keras.zero`` (no framework).

A flat vector of ``length`` elements is cut into one contiguous slice per rank, the way Horovod's
``reducescatter`` cuts a first dimension, so the slice a rank owns is the slice the engine hands it.
"""

from __future__ import annotations

from typing import NamedTuple

from .errors import ConfigError

__all__ = ["Slice", "partition"]


class Slice(NamedTuple):
    """The elements ``[start, stop)`` of a flat vector that one rank owns."""

    start: int
    stop: int


def partition(length: int, size: int) -> list[Slice]:
    """Cut ``length`` elements into ``size`` contiguous slices, one per rank, as Horovod's ``reducescatter`` does.

    Balanced (sizes differ by at most one; the first ``length % size`` ranks hold the larger ones),
    in rank order, covering ``range(length)`` exactly once; the same on every rank.
    """
    if isinstance(length, bool) or not isinstance(length, int) or length < 0:
        raise ConfigError(f"length must be an int >= 0 (got {length!r})")
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise ConfigError(f"size must be an int >= 1 (got {size!r})")
    base, extra = divmod(length, size)
    starts = [r * base + min(r, extra) for r in range(size + 1)]
    return [Slice(starts[r], starts[r + 1]) for r in range(size)]
