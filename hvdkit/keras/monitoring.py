"""Keras 3 callbacks that watch the job: which rank's train batches hold the others back
(``StragglerMonitorCallback``), rank 0's progress bar (``ProgressBarCallback``), and ``fit``'s job-wide
epoch metrics to TensorBoard and/or MLflow on rank 0 (``TrackMetricsCallback``)."""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TextIO

import keras

from ..core.log import get_logger
from ..core.monitoring.progress import Progress
from ..core.monitoring.straggler import StragglerMonitor, straggler_threshold
from ..core.options import check_positive_int
from ..tensorflow.monitoring import Tracker
from ..tensorflow.runtime import communicator, is_rank0, size
from .allreduce_clock import allreduce_seconds

__all__ = ["StragglerMonitorCallback", "ProgressBarCallback", "TrackMetricsCallback"]


_log = get_logger("keras")


class StragglerMonitorCallback(keras.callbacks.Callback):
    """At every epoch end, report the rank whose train batches are slowest (``hvdkit.core.monitoring.straggler``).

        model.fit(..., callbacks=[hk.BroadcastInitialStateCallback(), hk.StragglerMonitorCallback(threshold=1.2)])

    A batch's time runs from the end of the previous batch (the epoch's first: from its
    ``on_train_batch_begin``) to its ``on_train_batch_end``, so data loading, callbacks and the
    train step all count, minus the time ``hvdkit.keras.DistributedOptimizer`` spent in its gradient
    allreduce meanwhile (waiting for the slower ranks): what is left is the rank's own work, which
    points at the slow rank. With another optimizer that wait cannot be subtracted and every rank
    looks about as slow as the slowest (rank 0 says so once).

    Rank 0 logs a WARNING naming a rank above ``threshold`` (its host, its slowdown), INFO
    otherwise. The slowdown (the same on every rank) goes into the epoch's logs as ``log_key``
    (None: not logged); each epoch's ``hvdkit.core.StragglerReport`` is kept in ``self.reports``.
    ``self.monitor`` is the ``hvdkit.core.StragglerMonitor`` it records into, as ``hvdkit.torch.StragglerMonitor``.
    Collective: every rank's ``fit`` has it (same ``name``).
    Env: HVDKIT_STRAGGLER_THRESHOLD (when ``threshold`` is None; default 1.2).
    """

    def __init__(
        self,
        threshold: float | None = None,
        name: str = "keras.train",
        log_key: str | None = "straggler_slowdown",
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        super().__init__()
        self.threshold = straggler_threshold(threshold)  # a bad value fails here, not mid-fit
        self.name = name
        self.log_key = log_key
        self.reports = []
        self.monitor = None
        self._clock = clock
        self._last = None
        self._wait = 0.0

    def _waited(self):
        return allreduce_seconds(self.model.optimizer) or 0.0

    def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
        if self.monitor is None:
            self.monitor = StragglerMonitor(communicator(), self.threshold, self.name, clock=self._clock)
        if allreduce_seconds(self.model.optimizer) is None and self.monitor.comm.is_rank0:
            _log.warning(
                "StragglerMonitorCallback: the optimizer is not an hvdkit DistributedOptimizer, so allreduce waits are "
                "counted and every rank may look as slow as the slowest"
            )

    def on_epoch_begin(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        self._last = None

    def on_train_batch_begin(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        if self._last is None:
            self._last = self._clock()
            self._wait = self._waited()

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        now, waited = self._clock(), self._waited()
        if self._last is not None:
            self.monitor.record(max(0.0, now - self._last - (waited - self._wait)))
        self._last, self._wait = now, waited

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        report = self.monitor.epoch_end(epoch + 1)  # numbered as Keras prints epochs
        self.reports.append(report)
        if logs is not None and self.log_key:
            logs[self.log_key] = report.slowdown


class ProgressBarCallback(keras.callbacks.Callback):
    """Rank 0's progress through each epoch, then one line with the epoch's (averaged) metrics.

        model.fit(ds, epochs=10, verbose=0,
                  callbacks=[hk.BroadcastInitialStateCallback(), hk.MetricAverageCallback(),
                             hk.ProgressBarCallback(batch_size=32)])

    Use it with ``verbose=0`` (Keras's own bar shows one rank's numbers) and after ``MetricAverageCallback``
    so the epoch line holds job-wide metrics. ``batch_size`` is the per-rank batch: with it the bar
    shows samples per second over all ranks; without it, steps per second. On a terminal the line
    is redrawn; in a pipe a line is printed every HVDKIT_PROGRESS_INTERVAL seconds; off when not a
    terminal unless HVDKIT_PROGRESS=1, and always off with HVDKIT_PROGRESS=0. The epoch line is
    logged on rank 0 either way.
    Env: HVDKIT_PROGRESS, HVDKIT_PROGRESS_INTERVAL.
    """

    def __init__(self, batch_size: int | None = None, stream: TextIO | None = None) -> None:
        super().__init__()
        if batch_size is not None:
            check_positive_int("batch_size", batch_size, what="a positive integer, the per-rank batch")
        self.batch_size = batch_size
        self.stream = stream
        self._bar = None

    def on_epoch_begin(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        steps = self.params.get("steps") or 0
        epochs = self.params.get("epochs") or 0
        self._bar = Progress(max(1, steps), desc=f"epoch {epoch + 1}/{epochs}", show=is_rank0(), stream=self.stream)
        if not self.batch_size:
            self._bar.unit = "steps"

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        if self._bar is not None:
            self._bar.update(1, samples=(self.batch_size or 1) * (size() if self.batch_size else 1))

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None
        if is_rank0() and logs:
            metrics = " ".join(f"{k} {float(v):.4f}" for k, v in logs.items() if _is_number(v))
            _log.info("epoch %d/%s: %s", epoch + 1, self.params.get("epochs"), metrics)


def _is_number(v):
    try:
        float(v)
    except (TypeError, ValueError):
        return False
    return True


_tracking_log = get_logger("keras.tracking")


class TrackMetricsCallback(keras.callbacks.Callback):
    """Log every epoch's averaged metrics and learning rate to TensorBoard and/or MLflow from rank 0.

        model.fit(..., callbacks=[hk.MetricAverageCallback(), hk.TrackMetricsCallback("runs/exp1", params={"lr": 0.1})])

    Put it after ``MetricAverageCallback`` in the list: it logs the epoch-end logs as it finds them, and
    ``MetricAverageCallback`` is what makes them the metrics over all ranks' samples (before it, rank 0's
    own numbers would be logged). At the start of ``fit`` it opens a run (a ``Tracker``, see
    ``hvdkit.core.monitoring.tracking``) with ``params`` plus ``world_size``, ``epochs``, ``steps_per_epoch``
    and the optimizer's class; each epoch's logs (``val_*`` included) and ``learning_rate`` go in at
    step = the epoch index (0-based, as Keras' TensorBoard callback); the end of ``fit`` closes the
    run FINISHED. If ``fit`` raises, the run is marked FAILED when the process exits. Non-finite
    values (a diverged loss) are left out with a warning instead of stopping training. Each ``fit``
    call is a new run. Arguments are those of ``Tracker``.

    Collective: no (every rank may have it; only rank 0 writes).
    Env: MLFLOW_TRACKING_URI; sets MLFLOW_ALLOW_FILE_STORE for a ``file:`` URI.
    """

    def __init__(
        self,
        log_dir: str | os.PathLike[str],
        backends: str | Iterable[str] = ("tensorboard",),
        params: Mapping[str, Any] | None = None,
        mlflow_uri: str | None = None,
        experiment: str = "hvdkit",
        run_name: str | None = None,
    ) -> None:
        super().__init__()
        self._kwargs = dict(
            log_dir=log_dir,
            backends=backends,
            params=params,
            mlflow_uri=mlflow_uri,
            experiment=experiment,
            run_name=run_name,
        )
        self.tracker = None

    def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
        fit = {"epochs": self.params.get("epochs"), "steps_per_epoch": self.params.get("steps")}
        opt = self.model.optimizer
        if opt is not None:
            fit["optimizer"] = type(opt).__name__
        params = {**{k: v for k, v in fit.items() if v is not None}, **(self._kwargs["params"] or {})}
        self.tracker = Tracker(**{**self._kwargs, "params": params})

    def _learning_rate(self):
        opt = self.model.optimizer
        try:
            return float(keras.ops.convert_to_numpy(opt.learning_rate))
        except (AttributeError, TypeError, ValueError):  # no optimizer, or a rate Keras cannot report
            return None

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        metrics = {}
        for name, value in (logs or {}).items():
            try:
                metrics[name] = float(value)
            except (TypeError, ValueError):
                continue  # not a number (a callback may put anything in the logs)
        lr = self._learning_rate()
        if lr is not None:
            metrics.setdefault("learning_rate", lr)
        bad = sorted(k for k, v in metrics.items() if not math.isfinite(v))
        if bad and self.tracker.rank == 0:
            _tracking_log.warning(
                "epoch %d: not logging non-finite %s", epoch, ", ".join(f"{k}={metrics[k]}" for k in bad)
            )
        self.tracker.log_metrics({k: v for k, v in metrics.items() if k not in bad}, step=epoch)

    def on_train_end(self, logs: dict[str, Any] | None = None) -> None:
        if self.tracker is not None:
            self.tracker.close()
