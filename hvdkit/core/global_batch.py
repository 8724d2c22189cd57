"""A global batch kept constant at any world size, by choosing the gradient accumulation steps.

One optimizer step of a job with ``size`` ranks, a per-rank batch of ``batch_size`` and
``accumulation`` backward passes per step trains on a global batch of
``batch_size * size * accumulation`` samples. When a job is resumed with another number of ranks
(elastic shrink and grow), keeping that product fixed keeps the maths of every step: with
``global_batch_size=64`` and ``batch_size=32``, 2 ranks take 1 backward pass per step and 1 rank
takes 2. Without a global batch the accumulation stays as given, the global batch changes with
the world size, and the learning-rate rule (``hvdkit.core.lr``) is what adapts the training.
"""

from dataclasses import dataclass

from .errors import ConfigError
from .options import check_positive_int

__all__ = ["BatchPlan", "plan_batches"]


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
    def global_batch_size(self):
        """Samples per optimizer step over all ranks."""
        return self.batch_size * self.size * self.accumulation

    @property
    def slots(self):
        """Micro-batches per optimizer step over all ranks (``size * accumulation``)."""
        return self.size * self.accumulation

    def check_dataset(self, n):
        """``n`` if ``n`` samples fill every micro-batch of a step, else ConfigError naming the fix."""
        if n < self.slots:
            raise ConfigError(
                f"{n} samples cannot be split over {self.size} ranks x {self.accumulation} accumulation steps "
                "(every micro-batch needs one); use fewer ranks, a larger batch_size, or more data"
            )
        return n

    def describe(self):
        """One line for the log, e.g. ``world size 1: global batch 64 = 32 per rank x 1 rank x 2 accumulation steps``."""
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


def plan_batches(batch_size, size, global_batch_size=None, accumulation=1):
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
            f"use a per-rank batch_size of {' or '.join(map(str, fits))}, or a global_batch_size that is a multiple of {per_step}"
            if fits
            else f"use a global_batch_size that is a multiple of {per_step} (or of {size} ranks x a smaller batch_size)"
        )
        raise ConfigError(
            f"global_batch_size={global_batch_size} cannot be split into batch_size={batch_size} per rank x "
            f"{size} ranks x a whole number of accumulation steps ({global_batch_size} / ({batch_size} x {size}) "
            f"= {global_batch_size / per_step:g}); {fix}"
        )
    return BatchPlan(batch_size, size, global_batch_size // per_step, fixed=True)
