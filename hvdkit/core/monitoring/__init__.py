"""Watching a job from rank 0: straggler statistics, progress, and experiment tracking with its writers.

``straggler`` (which rank holds the job back), ``progress`` (steps, samples/s, ETA), ``tracking``
(TensorBoard and MLflow runs of job-wide metrics) and its writers ``tensorboard_events``
(with ``tfrecord``, the byte layer) and ``mlflow_store``. Framework-free; each adapter's
``monitoring`` module connects these to its training loop.
"""

from .progress import Progress
from .straggler import StragglerMonitor, StragglerReport
from .tracking import Tracker

__all__ = ["Progress", "StragglerMonitor", "StragglerReport", "Tracker"]
