"""The Keras adapter's old names, kept for one release (removed in hvdkit 0.3): each warns, then works as before.

The callbacks are named ``...Callback`` now, as in Horovod, and each concept has the name it has in
``hvdkit.torch`` and ``hvdkit.tensorflow`` (``docs/api/names.md``).
"""

from __future__ import annotations

import keras

from ..core.deprecation import Deprecated
from .callbacks import (
    BroadcastInitialStateCallback,
    CheckpointCallback,
    LearningRateWarmupCallback,
    MetricAverageCallback,
)
from .monitoring import ProgressBarCallback, StragglerMonitorCallback, TrackMetricsCallback
from .optimizer import ScaledLRSchedule

__all__ = [
    "BroadcastInitialState",
    "Checkpoint",
    "LearningRateWarmup",
    "MetricAverage",
    "ProgressBar",
    "ScaledSchedule",
    "StragglerReport",
    "TrackMetrics",
]


class BroadcastInitialState(Deprecated, BroadcastInitialStateCallback):
    """Deprecated name of ``BroadcastInitialStateCallback`` (removed in hvdkit 0.3)."""

    renamed = ("hvdkit.keras.BroadcastInitialState", "hvdkit.keras.BroadcastInitialStateCallback")


class Checkpoint(Deprecated, CheckpointCallback):
    """Deprecated name of ``CheckpointCallback`` (removed in hvdkit 0.3); its ``restore()`` returns the epoch.

    ``CheckpointCallback.restore()`` returns a ``Resumed`` or None, like ``Checkpointer.restore()``
    of the other adapters; pass ``ckpt.initial_epoch`` to ``fit``.
    """

    renamed = ("hvdkit.keras.Checkpoint", "hvdkit.keras.CheckpointCallback (restore() returns a Resumed or None)")

    def restore(self) -> int:
        """The epoch to pass as ``initial_epoch``: the restored checkpoint's, or 0. Collective."""
        super().restore()
        return self.initial_epoch


class LearningRateWarmup(Deprecated, LearningRateWarmupCallback):
    """Deprecated name of ``LearningRateWarmupCallback`` (removed in hvdkit 0.3)."""

    renamed = ("hvdkit.keras.LearningRateWarmup", "hvdkit.keras.LearningRateWarmupCallback")


class MetricAverage(Deprecated, MetricAverageCallback):
    """Deprecated name of ``MetricAverageCallback`` (removed in hvdkit 0.3)."""

    renamed = ("hvdkit.keras.MetricAverage", "hvdkit.keras.MetricAverageCallback")


class ProgressBar(Deprecated, ProgressBarCallback):
    """Deprecated name of ``ProgressBarCallback`` (removed in hvdkit 0.3)."""

    renamed = ("hvdkit.keras.ProgressBar", "hvdkit.keras.ProgressBarCallback")


@keras.saving.register_keras_serializable(package="hvdkit")  # models saved with the old name still load
class ScaledSchedule(Deprecated, ScaledLRSchedule):
    """Deprecated name of ``ScaledLRSchedule`` (removed in hvdkit 0.3)."""

    renamed = ("hvdkit.keras.ScaledSchedule", "hvdkit.keras.ScaledLRSchedule")


class StragglerReport(Deprecated, StragglerMonitorCallback):
    """Deprecated name of ``StragglerMonitorCallback`` (removed in hvdkit 0.3).

    ``hvdkit.core.StragglerReport`` is the report it keeps for each epoch (``reports``).
    """

    renamed = ("hvdkit.keras.StragglerReport", "hvdkit.keras.StragglerMonitorCallback")


class TrackMetrics(Deprecated, TrackMetricsCallback):
    """Deprecated name of ``TrackMetricsCallback`` (removed in hvdkit 0.3)."""

    renamed = ("hvdkit.keras.TrackMetrics", "hvdkit.keras.TrackMetricsCallback")
