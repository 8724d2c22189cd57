"""Watching a torch job: straggler reports, experiment tracking and rank 0's progress bar.

The logic is in ``hvdkit.core.monitoring`` (``straggler``, ``tracking``, ``progress``); these pass in
the job's communicator and, for the monitor, hook into ``hvdkit.torch.DistributedOptimizer``;
``progress(loader)`` wraps a data loader.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, TextIO, TypeVar

from ..core.errors import ConfigError
from ..core.monitoring.progress import Progress
from ..core.monitoring.straggler import StragglerMonitor as _StragglerMonitor
from ..core.monitoring.tracking import RuntimeTracker
from .runtime import _runtime, communicator, is_rank0, size

if TYPE_CHECKING:
    import torch

__all__ = ["StragglerMonitor", "Tracker", "progress"]

_T = TypeVar("_T")


class StragglerMonitor(_StragglerMonitor):
    """``hvdkit.core.StragglerMonitor`` on this job's communicator: which rank's steps hold the job back.

        opt = hk.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model=model)
        monitor = hk.StragglerMonitor(threshold=1.2, optimizer=opt)
        for epoch in range(epochs):
            for x, y in loader:
                with monitor.step():                    # the whole step
                    opt.zero_grad(); loss_fn(model(x), y).backward(); opt.step()
            report = monitor.epoch_end(epoch)           # report.straggler: a rank or None

    With ``optimizer`` (an ``hvdkit.torch.DistributedOptimizer``), the time its ``synchronize()``
    spends inside a monitored step, waiting for the other ranks' gradients, is left out of the
    step's time, so timing the whole step points at the slow rank. Without it, time only the
    compute part (everything but ``opt.step()``), or every rank looks as slow as the slowest.
    ``clock`` and ``host`` are those of the core class (for tests).
    Collective: every rank creates it with the same ``name`` and calls ``epoch_end()``.
    Env: HVDKIT_STRAGGLER_THRESHOLD (when ``threshold`` is None; default 1.2).
    """

    def __init__(
        self,
        threshold: float | None = None,
        name: str = "train",
        optimizer: torch.optim.Optimizer | None = None,
        clock: Callable[[], float] = time.perf_counter,
        host: str | None = None,
    ) -> None:
        super().__init__(communicator(), threshold=threshold, name=name, clock=clock, host=host)
        if optimizer is not None:
            _exclude_synchronize(optimizer, self)


def _exclude_synchronize(optimizer, monitor):
    """Report the time of every ``optimizer.synchronize()`` to ``monitor`` as a wait."""
    if not callable(getattr(optimizer, "add_synchronize_listener", None)):
        raise ConfigError(
            f"optimizer must be an hvdkit.torch.DistributedOptimizer (got {type(optimizer).__name__}); "
            "wrap it first: hk.DistributedOptimizer(opt, model=model)"
        )
    optimizer.add_synchronize_listener(monitor.add_wait)


class Tracker(RuntimeTracker):
    """``hvdkit.core.monitoring.tracking.Tracker`` on the job's communicator: metrics to TensorBoard/MLflow from rank 0.

        with hk.Tracker("runs/exp1", backends=("tensorboard", "mlflow"), params={"lr": 0.1}) as tracker:
            for epoch in range(epochs):
                ...
                tracker.log_metrics(hk.average_metrics(totals), step=epoch)  # averaged on every rank first

    Collective: no (the metrics passed in must already be averaged over ranks).
    Env: MLFLOW_TRACKING_URI; sets MLFLOW_ALLOW_FILE_STORE for a ``file:`` URI.
    """

    runtime = _runtime


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


def progress(
    loader: Iterable[_T], desc: str = "", total: int | None = None, stream: TextIO | None = None
) -> Iterator[_T]:
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
