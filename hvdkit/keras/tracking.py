"""Keras 3 experiment tracking: ``fit``'s job-wide epoch metrics to TensorBoard and/or MLflow, on rank 0."""

import math

import keras

from ..core.log import get_logger
from ..tensorflow.monitoring import Tracker

__all__ = ["TrackMetricsCallback"]

_log = get_logger("keras.tracking")


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
        self, log_dir, backends=("tensorboard",), params=None, mlflow_uri=None, experiment="hvdkit", run_name=None
    ):
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

    def on_train_begin(self, logs=None):
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

    def on_epoch_end(self, epoch, logs=None):
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
            _log.warning("epoch %d: not logging non-finite %s", epoch, ", ".join(f"{k}={metrics[k]}" for k in bad))
        self.tracker.log_metrics({k: v for k, v in metrics.items() if k not in bad}, step=epoch)

    def on_train_end(self, logs=None):
        if self.tracker is not None:
            self.tracker.close()
