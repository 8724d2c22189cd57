"""ZeRO-1's contract and arithmetic, shared by ``hvdkit.torch.zero`` and ``hvdkit.keras.zero`` (no framework).

A flat vector of ``length`` elements is cut into one contiguous slice per rank, the way Horovod's
``reducescatter`` cuts a first dimension, so the slice a rank owns is the slice the engine hands it.
``plan_rounds`` cuts the moving of those slices (reduce-scatter, all-gather) into rounds of bounded
size, so that no round needs a temporary larger than a fixed number of elements; ``rank_parts``
says which elements of a round's piece each rank holds, ``spans`` which tensors a run of a flat
vector covers, ``pack_rounds`` packs consecutive items into rounds of bounded size.

``ShardedState`` is what a checkpointer needs of a sharded optimizer, whichever the framework.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterator, Sequence
from typing import Any, NamedTuple, Protocol, runtime_checkable

from .errors import ConfigError

__all__ = [
    "CHUNK_ELEMENTS",
    "ROUND_ELEMENTS",
    "Piece",
    "ShardedState",
    "Slice",
    "pack_rounds",
    "partition",
    "plan_rounds",
    "rank_parts",
    "spans",
]

# Elements (all ranks' parts together) one round of a step's reduce-scatter or all-gather moves: the
# bound on its temporaries (16 MiB of fp32). The torch and Keras optimizers' default round_elements.
ROUND_ELEMENTS = 1 << 22
# Elements of optimizer state one round of a consolidation or a scatter of the state moves (16 MiB of
# fp32): the torch optimizer's default chunk_elements.
CHUNK_ELEMENTS = 1 << 22


@runtime_checkable
class ShardedState(Protocol):
    """An optimizer whose state is sharded over the ranks (ZeRO-1), as a checkpointer sees it.

    Its state is saved and restored as the unsharded optimizer's (the same at any world size), in
    that framework's form: torch a state dict, Keras the list of the unsharded optimizer's variables
    as arrays. ``hvdkit.torch.zero.ShardedOptimizer`` and the optimizers of
    ``hvdkit.keras.DistributedOptimizer(..., shard_optimizer_state=True)`` satisfy it;
    ``isinstance(opt, ShardedState)`` is how ``hvdkit.torch.Checkpointer`` and
    ``hvdkit.tensorflow.Checkpointer`` tell them apart. ``docs/api/names.md`` maps these names to
    each framework's own (``consolidate_state_dict``/``state_dict``, ``consolidated_variables``).
    """

    def consolidate(self, to: int | None = 0) -> Any:
        """Gather the unsharded state to rank ``to`` (None: every rank); return it there, None elsewhere.

        Collective: every rank calls it alike. ConfigError names a ``to`` that is not a rank.
        """
        ...

    def load_unsharded(self, state: Any) -> None:
        """Set the state from the unsharded optimizer's (from any world size), keeping this rank's slices.

        No collective.
        """
        ...


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


def rank_parts(bounds: Sequence[Slice], piece: Piece) -> list[tuple[int, int]]:
    """Each rank's elements of ``piece`` in its flat vector, ``(start, stop)`` in rank order.

    ``bounds``: the vector's ``partition``. A rank's part is the elements ``[piece.lo, piece.hi)`` of
    its slice, cut short where the slice is (maybe empty).
    """
    return [(a + min(piece.lo, b - a), a + min(piece.hi, b - a)) for a, b in bounds]


def spans(offsets: Sequence[int], start: int, stop: int) -> Iterator[tuple[int, int, int]]:
    """``(index, lo, hi)`` for each tensor that overlaps the flat elements ``[start, stop)``: its elements ``[lo, hi)``.

    ``offsets``: where each tensor starts in the flat vector, then its length (``offsets[i + 1] -
    offsets[i]`` elements for tensor ``i``). Tensors in order; one with no element in the run is skipped.
    """
    for i in range(len(offsets) - 1):
        lo, hi = max(start - offsets[i], 0), min(stop - offsets[i], offsets[i + 1] - offsets[i])
        if lo < hi:
            yield i, lo, hi


def pack_rounds(sizes: Sequence[int], limit: int, kinds: Sequence[Hashable] | None = None) -> list[list[int]]:
    """The indices of ``sizes`` (elements of each item, in order) packed into rounds of consecutive items.

    A round holds at most ``limit`` elements, or a single item larger than that; with ``kinds``
    (one per item, e.g. a dtype) a round holds items of one kind only. Every index appears once, in
    order; the same on every rank.
    """
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise ConfigError(f"limit must be an int >= 1 (got {limit!r})")
    rounds: list[list[int]] = []
    used = limit
    for i, n in enumerate(sizes):
        if not rounds or used + n > limit or (kinds is not None and kinds[i] != kinds[rounds[-1][-1]]):
            rounds.append([])
            used = 0
        rounds[-1].append(i)
        used += n
    return rounds
