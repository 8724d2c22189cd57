"""Watching a TensorFlow job: experiment tracking on this job's communicator (``hvdkit.core.monitoring.tracking``)."""

from ..core.monitoring.tracking import RuntimeTracker
from .runtime import _runtime

__all__ = ["Tracker"]


class Tracker(RuntimeTracker):
    """``hvdkit.core.monitoring.tracking.Tracker`` on the job's communicator: metrics to TensorBoard/MLflow from rank 0.

        with htf.Tracker("runs/exp1", backends=("tensorboard", "mlflow"), params={"lr": 0.1}) as tracker:
            for epoch in range(epochs):
                ...
                tracker.log_metrics(htf.average_metrics(totals), step=epoch)  # averaged on every rank first

    Keras ``fit`` users: ``hvdkit.keras.TrackMetricsCallback`` opens one per ``fit``.
    Collective: no (the metrics passed in must already be averaged over ranks).
    Env: MLFLOW_TRACKING_URI; sets MLFLOW_ALLOW_FILE_STORE for a ``file:`` URI.
    """

    runtime = _runtime
