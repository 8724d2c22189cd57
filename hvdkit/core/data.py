"""The data side of training at any world size: which samples each rank takes, and the global batch.

**Sample order**: which samples each rank trains on, as a function of the epoch and a global
sample offset. The rule that lets a job stop at one world size and continue at another without skipping or
repeating a sample (framework-free; the torch sampler and the Keras dataset both use it):

1. Epoch ``e`` visits the ``n`` samples in one order drawn from ``(seed, e)`` alone
   (``epoch_order``), the same on every rank and at every world size.
2. The position in the epoch is the number of samples of that order already trained on (the
   *global sample offset*, saved in checkpoints). From offset ``start`` the rest of the order is
   cut into optimizer steps of ``global_batch_size`` consecutive positions (``step_bounds``).
   A last piece shorter than the step's micro-batch count (``slots``) is merged into the step
   before, so no micro-batch is empty; with ``drop_last`` the last ``(n - start) % global_batch_size``
   positions are skipped instead.
3. Within a step of positions ``[begin, end)`` micro-batch ``j`` of rank ``r`` is slot
   ``t = j * size + r`` of ``slots = size * accumulation`` and takes positions
   ``begin + t, begin + t + slots, ...`` (``slot_positions``). So with a fixed global batch and
   per-rank batch (fixed ``slots``) every slot holds the same samples whatever the world size,
   and a step's gradient is the same mean of slot means.

Every sample of the epoch is then used exactly once across any sequence of stops and restarts at
any world sizes, as long as the offset saved at a stop is ``position(...)`` of the steps taken.
Only when fewer positions remain than ``slots`` (possible only after a restart at a larger world
size without a fixed global batch) does a slot repeat a sample of that last step, so that no rank
gets an empty micro-batch.

**Global batch**: kept constant at any world size by choosing the gradient accumulation steps.
One optimizer step of a job with ``size`` ranks, a per-rank batch of ``batch_size`` and
``accumulation`` backward passes per step trains on a global batch of
``batch_size * size * accumulation`` samples. When a job is resumed with another number of ranks
(elastic shrink and grow), keeping that product fixed keeps the maths of every step: with
``global_batch_size=64`` and ``batch_size=32``, 2 ranks take 1 backward pass per step and 1 rank
takes 2. Without a global batch the accumulation stays as given, the global batch changes with
the world size, and the learning-rate rule (``hvdkit.core.lr``) is what adapts the training.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from .errors import ConfigError
from .options import check_positive_int

__all__ = [
    "epoch_order",
    "step_bounds",
    "slot_positions",
    "rank_batches",
    "position_after",
    "rank_seed",
    "BatchPlan",
    "plan_batches",
]


def epoch_order(n: int, seed: int, epoch: int, shuffle: bool = True) -> np.ndarray:
    """The order of the ``n`` sample indices in ``epoch``: a permutation drawn from ``(seed, epoch)``, or 0..n-1."""
    if not shuffle:
        return np.arange(n, dtype=np.int64)
    return np.random.default_rng([int(seed) & 0xFFFFFFFF, int(epoch)]).permutation(n).astype(np.int64)


def step_bounds(
    n: int, start: int, global_batch_size: int, slots: int, drop_last: bool = False
) -> list[tuple[int, int]]:
    """``[(begin, end), ...]``: each optimizer step's positions left in an epoch of ``n`` samples from ``start``."""
    if isinstance(start, bool) or not isinstance(start, (int, np.integer)) or not 0 <= start <= n:
        raise ConfigError(
            f"the epoch's sample offset must be a whole number from 0 to {n}, the samples in the dataset "
            f"(got {start!r}); resume with the offset saved by the same dataset's loader"
        )
    start = int(start)
    full, tail = divmod(n - start, global_batch_size)
    bounds = [(start + i * global_batch_size, start + (i + 1) * global_batch_size) for i in range(full)]
    if tail and not drop_last:
        if bounds and tail < slots:
            bounds[-1] = (bounds[-1][0], n)
        else:
            bounds.append((n - tail, n))
    return bounds


def slot_positions(begin: int, end: int, slot: int, slots: int) -> list[int]:
    """The positions micro-batch ``slot`` (of ``slots``) takes in the step ``[begin, end)``."""
    if end - begin < slots:  # only after growing without a fixed global batch: repeat rather than leave it empty
        return [begin + slot % (end - begin)]
    return list(range(begin + slot, end, slots))


def rank_batches(
    order: np.ndarray, bounds: Sequence[tuple[int, int]], rank: int, size: int, accumulation: int
) -> Iterator[list[int]]:
    """This rank's micro-batches (lists of sample indices), step after step, ``accumulation`` per step."""
    slots = size * accumulation
    for begin, end in bounds:
        for j in range(accumulation):
            yield [int(i) for i in order[slot_positions(begin, end, j * size + rank, slots)]]


def position_after(bounds: Sequence[tuple[int, int]], steps: int, start: int) -> int:
    """The global sample offset in the epoch after the first ``steps`` of ``bounds`` (``start`` after none)."""
    if steps <= 0:
        return start
    return bounds[min(steps, len(bounds)) - 1][1]


def rank_seed(seed: int, step: int, rank: int) -> int:
    """A 63-bit seed drawn from ``(seed, step, rank)`` alone, for re-seeding a rank's RNGs.

    Used when a checkpoint is restored at another world size: per-rank RNG states cannot carry
    over (a new rank has none; rank r's belonged to another shard), so each rank starts new
    streams that are the same for the same ``(seed, step, rank)``: a resumed run is reproducible.
    """
    words = np.random.SeedSequence([int(seed) & 0xFFFFFFFF, int(step), int(rank)]).generate_state(2, np.uint32)
    return (int(words[0]) << 32 | int(words[1])) & 0x7FFFFFFFFFFFFFFF


@dataclass(frozen=True)
class BatchPlan:
    """How one optimizer step is split: ``batch_size`` per rank x ``size`` ranks x ``accumulation`` passes.

    ``fixed`` is True when the global batch was asked for (``global_batch_size=``), so it stays the
    same at any world size; False when it follows from the per-rank batch and the world size.
    """

    batch_size: int
    size: int
    accumulation: int
    fixed: bool = False

    @property
    def global_batch_size(self) -> int:
        """Samples per optimizer step over all ranks."""
        return self.batch_size * self.size * self.accumulation

    @property
    def slots(self) -> int:
        """Micro-batches per optimizer step over all ranks (``size * accumulation``)."""
        return self.size * self.accumulation

    def check_dataset(self, n: int) -> int:
        """``n`` if ``n`` samples fill every micro-batch of a step, else ConfigError naming the fix."""
        if n < self.slots:
            raise ConfigError(
                f"{n} samples cannot be split over {self.size} ranks x {self.accumulation} accumulation steps "
                "(every micro-batch needs one); use fewer ranks, a larger batch_size, or more data"
            )
        return n

    def describe(self) -> str:
        """One line for the log.

        For example ``world size 1: global batch 64 = 32 per rank x 1 rank x 2 accumulation steps``.
        """
        ranks = "rank" if self.size == 1 else "ranks"
        steps = "accumulation step" if self.accumulation == 1 else "accumulation steps"
        kept = "" if self.fixed else " (no global_batch_size given: it changes with the world size)"
        return (
            f"world size {self.size}: global batch {self.global_batch_size} = {self.batch_size} per rank x "
            f"{self.size} {ranks} x {self.accumulation} {steps}{kept}"
        )


def _fitting_batch_sizes(global_batch_size, size, batch_size):
    """Per-rank batch sizes <= ``batch_size`` that split ``global_batch_size`` over ``size`` ranks (largest first)."""
    if global_batch_size % size:
        return []
    per_rank = global_batch_size // size
    return [b for b in range(min(batch_size, per_rank), 0, -1) if per_rank % b == 0][:3]


def plan_batches(batch_size: int, size: int, global_batch_size: int | None = None, accumulation: int = 1) -> BatchPlan:
    """The ``BatchPlan`` for ``size`` ranks: accumulation chosen so the global batch is ``global_batch_size``.

    Without ``global_batch_size`` the plan keeps ``accumulation`` (the caller's
    ``backward_passes_per_step``). With it, ``accumulation`` is ignored and becomes
    ``global_batch_size / (batch_size * size)``, which must be a whole number: otherwise
    ConfigError names the three values and the per-rank batch sizes that would work.

    >>> plan_batches(32, 1, global_batch_size=64).describe()
    'world size 1: global batch 64 = 32 per rank x 1 rank x 2 accumulation steps'
    """
    check_positive_int("batch_size", batch_size, what="an integer >= 1, the per-rank batch")
    check_positive_int("size", size, what="an integer >= 1, the number of ranks")
    if global_batch_size is None:
        check_positive_int("backward_passes_per_step", accumulation)
        return BatchPlan(batch_size, size, accumulation)
    check_positive_int("global_batch_size", global_batch_size, what="an integer >= 1, the samples per optimizer step")
    per_step = batch_size * size
    if global_batch_size % per_step:
        fits = _fitting_batch_sizes(global_batch_size, size, batch_size)
        fix = (
            f"use a per-rank batch_size of {' or '.join(map(str, fits))}, "
            f"or a global_batch_size that is a multiple of {per_step}"
            if fits
            else f"use a global_batch_size that is a multiple of {per_step} (or of {size} ranks x a smaller batch_size)"
        )
        raise ConfigError(
            f"global_batch_size={global_batch_size} cannot be split into batch_size={batch_size} per rank x "
            f"{size} ranks x a whole number of accumulation steps ({global_batch_size} / ({batch_size} x {size}) "
            f"= {global_batch_size / per_step:g}); {fix}"
        )
    return BatchPlan(batch_size, size, global_batch_size // per_step, fixed=True)
