"""Which samples each rank trains on, as a function of the epoch and a global sample offset.

The rule that lets a job stop at one world size and continue at another without skipping or
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
"""

import numpy as np

from .errors import ConfigError

__all__ = ["epoch_order", "step_bounds", "slot_positions", "rank_batches", "position_after", "rank_seed"]


def epoch_order(n, seed, epoch, shuffle=True):
    """The order of the ``n`` sample indices in ``epoch``: a permutation drawn from ``(seed, epoch)``, or 0..n-1."""
    if not shuffle:
        return np.arange(n, dtype=np.int64)
    return np.random.default_rng([int(seed) & 0xFFFFFFFF, int(epoch)]).permutation(n).astype(np.int64)


def step_bounds(n, start, global_batch_size, slots, drop_last=False):
    """``[(begin, end), ...]``: the positions of each optimizer step left in an epoch of ``n`` samples from ``start``."""
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


def slot_positions(begin, end, slot, slots):
    """The positions micro-batch ``slot`` (of ``slots``) takes in the step ``[begin, end)``."""
    if end - begin < slots:  # only after growing without a fixed global batch: repeat rather than leave it empty
        return [begin + slot % (end - begin)]
    return list(range(begin + slot, end, slots))


def rank_batches(order, bounds, rank, size, accumulation):
    """This rank's micro-batches (lists of sample indices), step after step, ``accumulation`` per step."""
    slots = size * accumulation
    for begin, end in bounds:
        for j in range(accumulation):
            yield [int(i) for i in order[slot_positions(begin, end, j * size + rank, slots)]]


def position_after(bounds, steps, start):
    """The global sample offset in the epoch after the first ``steps`` of ``bounds`` (``start`` after none)."""
    if steps <= 0:
        return start
    return bounds[min(steps, len(bounds)) - 1][1]


def rank_seed(seed, step, rank):
    """A 63-bit seed drawn from ``(seed, step, rank)`` alone, for re-seeding a rank's RNGs.

    Used when a checkpoint is restored at another world size: per-rank RNG states cannot carry
    over (a new rank has none; rank r's belonged to another shard), so each rank starts new
    streams that are the same for the same ``(seed, step, rank)``: a resumed run is reproducible.
    """
    words = np.random.SeedSequence([int(seed) & 0xFFFFFFFF, int(step), int(rank)]).generate_state(2, np.uint32)
    return (int(words[0]) << 32 | int(words[1])) & 0x7FFFFFFFFFFFFFFF
