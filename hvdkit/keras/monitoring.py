"""Keras 3 callbacks that watch the job: which rank's train batches hold the others back."""

import time

import keras

from ..core.log import get_logger
from ..core.monitoring.straggler import StragglerMonitor, straggler_threshold
from ..tensorflow.runtime import communicator
from .allreduce_clock import allreduce_seconds

__all__ = ["StragglerMonitorCallback"]

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

    def __init__(self, threshold=None, name="keras.train", log_key="straggler_slowdown", clock=time.perf_counter):
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

    def on_train_begin(self, logs=None):
        if self.monitor is None:
            self.monitor = StragglerMonitor(communicator(), self.threshold, self.name, clock=self._clock)
        if allreduce_seconds(self.model.optimizer) is None and self.monitor.comm.is_rank0:
            _log.warning(
                "StragglerMonitorCallback: the optimizer is not an hvdkit DistributedOptimizer, so allreduce waits are "
                "counted and every rank may look as slow as the slowest"
            )

    def on_epoch_begin(self, epoch, logs=None):
        self._last = None

    def on_train_batch_begin(self, batch, logs=None):
        if self._last is None:
            self._last = self._clock()
            self._wait = self._waited()

    def on_train_batch_end(self, batch, logs=None):
        now, waited = self._clock(), self._waited()
        if self._last is not None:
            self.monitor.record(max(0.0, now - self._last - (waited - self._wait)))
        self._last, self._wait = now, waited

    def on_epoch_end(self, epoch, logs=None):
        report = self.monitor.epoch_end(epoch + 1)  # numbered as Keras prints epochs
        self.reports.append(report)
        if logs is not None and self.log_key:
            logs[self.log_key] = report.slowdown
