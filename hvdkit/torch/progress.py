"""A rank-0 progress bar over a PyTorch data loader: steps, samples per second (all ranks), ETA."""

from ..core.errors import ConfigError
from ..core.monitoring.progress import Progress
from .runtime import is_rank0, size

__all__ = ["progress"]


def _batch_len(batch):
    """Samples in one batch: the length of its first tensor (a tensor, or a tuple/list/dict of them)."""
    if isinstance(batch, dict):
        batch = next(iter(batch.values()), None)
    elif isinstance(batch, (tuple, list)):
        batch = batch[0] if batch else None
    try:
        return len(batch)
    except TypeError:
        return 0


def progress(loader, desc="", total=None, stream=None):
    """Iterate ``loader`` while rank 0 shows progress: steps, samples/s over all ranks, elapsed, ETA.

        for x, y in hk.progress(train_loader, desc=f"epoch {epoch + 1}/{epochs}"):
            ...

    Samples per second count every rank's batches (a rank's batch length x world size). Shown on
    rank 0 only; on a terminal the line is redrawn, in a pipe (``hvdkit run``, a log file) a line
    is printed every HVDKIT_PROGRESS_INTERVAL seconds; off when not a terminal unless
    HVDKIT_PROGRESS=1, and always off with HVDKIT_PROGRESS=0. ``total`` (steps) defaults to
    ``len(loader)``; pass it for an iterator without a length.
    Collective: no (each rank iterates its own shard).
    Env: HVDKIT_PROGRESS, HVDKIT_PROGRESS_INTERVAL.
    """
    if total is None:
        if not hasattr(loader, "__len__"):
            raise ConfigError(
                f"progress() needs the number of steps: {type(loader).__name__} has no len(); pass total=N"
            )
        total = len(loader)
    return _iterate(loader, Progress(total, desc=desc, show=is_rank0(), stream=stream), size())


def _iterate(loader, bar, world):
    try:
        for batch in loader:
            yield batch
            bar.update(1, samples=_batch_len(batch) * world)
    finally:
        bar.close()
