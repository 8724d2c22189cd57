"""A rank-0 progress bar for Keras ``fit``: steps, samples per second over all ranks, ETA, averaged metrics."""

import keras

from ..core.log import get_logger
from ..core.monitoring.progress import Progress
from ..core.options import check_positive_int
from ..tensorflow.runtime import is_rank0, size

__all__ = ["ProgressBarCallback"]

_log = get_logger("keras")


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

    def __init__(self, batch_size=None, stream=None):
        super().__init__()
        if batch_size is not None:
            check_positive_int("batch_size", batch_size, what="a positive integer, the per-rank batch")
        self.batch_size = batch_size
        self.stream = stream
        self._bar = None

    def on_epoch_begin(self, epoch, logs=None):
        steps = self.params.get("steps") or 0
        epochs = self.params.get("epochs") or 0
        self._bar = Progress(max(1, steps), desc=f"epoch {epoch + 1}/{epochs}", show=is_rank0(), stream=self.stream)
        if not self.batch_size:
            self._bar.unit = "steps"

    def on_train_batch_end(self, batch, logs=None):
        if self._bar is not None:
            self._bar.update(1, samples=(self.batch_size or 1) * (size() if self.batch_size else 1))

    def on_epoch_end(self, epoch, logs=None):
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
