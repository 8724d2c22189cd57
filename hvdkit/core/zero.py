"""ZeRO-1's partition arithmetic, shared by ``hvdkit.torch.zero`` and ``hvdkit.keras.zero`` (no framework).

A flat vector of ``length`` elements is cut into one contiguous slice per rank, the way Horovod's
``reducescatter`` cuts a first dimension, so the slice a rank owns is the slice the engine hands it.
``plan_rounds`` cuts the moving of those slices (reduce-scatter, all-gather) into rounds of bounded
size, so that no round needs a temporary larger than a fixed number of elements.
"""

from __future__ import annotations

from typing import NamedTuple

from .errors import ConfigError

__all__ = ["Piece", "Slice", "partition", "plan_rounds"]


class Piece(NamedTuple):
    """The elements ``[lo, hi)`` of every rank's slice of flat vector ``group`` (counted from the slice's
    start; a rank whose slice is shorter holds fewer of them, maybe none)."""

    group: int
    lo: int
    hi: int


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


def plan_rounds(lengths: list[int], size: int, limit: int) -> list[list[Piece]]:
    """Cut the moving of every rank's slice of several flat vectors into rounds; the same plan on every rank.

    ``lengths``: the flat vectors' lengths; each is partitioned over ``size`` ranks (``partition``).
    In each round every rank contributes its part of each ``Piece`` (the larger slices first, as
    ``partition`` orders them, so a round's parts of one vector are themselves a balanced partition
    of their sum, the cut Horovod's ``reducescatter`` makes). A round holds at most
    ``max(limit // size, 1)`` elements of the largest slice per rank, so at most ``max(limit, size)``
    elements over all ranks: the bound on a round's temporary. Pieces follow the vectors' order and,
    within one, the slice's order; a vector of length 0 has none.
    """
    for name, value, least in (("size", size, 1), ("limit", limit, 1)):
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            raise ConfigError(f"{name} must be an int >= {least} (got {value!r})")
    per_rank = max(limit // size, 1)
    rounds: list[list[Piece]] = []
    used = per_rank
    for g, length in enumerate(lengths):
        first = partition(length, size)[0]  # rank 0 holds the longest slice
        lo = 0
        while lo < first.stop:
            if used == per_rank:
                rounds.append([])
                used = 0
            hi = min(lo + per_rank - used, first.stop)
            rounds[-1].append(Piece(g, lo, hi))
            used += hi - lo
            lo = hi
    return rounds
