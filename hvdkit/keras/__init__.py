"""hvdkit for Keras 3 (TensorFlow backend): ``model.fit`` on many ranks, gradients really averaged.

    import hvdkit.keras as hk
    hk.init()
    model.compile(optimizer=hk.DistributedOptimizer(keras.optimizers.SGD(0.01)), loss=..., metrics=[...])
    ckpt = hk.CheckpointCallback("checkpoints/run1", model)
    ckpt.restore()                                  # a Resumed, or None on a fresh start
    model.fit(hk.shard(train_ds).batch(32), initial_epoch=ckpt.initial_epoch, epochs=10,
              callbacks=[hk.BroadcastInitialStateCallback(), hk.MetricAverageCallback(), ckpt],
              verbose=1 if hk.is_rank0() else 0)

Why not ``horovod.tensorflow.keras``: under Keras 3 its DistributedOptimizer hooks methods that
``fit`` never calls, so ranks train apart without any error, and its callbacks crash.
"""

from ..tensorflow import (  # one runtime for TensorFlow and Keras
    PreemptionGuard,
    Resumed,
    Tracker,
    average_metrics,
    batch_plan,
    broadcast_variables,
    communicator,
    epoch_dataset,
    init,
    is_rank0,
    local_rank,
    local_size,
    rank,
    scaled_lr,
    shard,
    size,
    topology,
)
from .callbacks import (
    BroadcastInitialStateCallback,
    CheckpointCallback,
    LearningRateWarmupCallback,
    MetricAverageCallback,
    average_model_metrics,
)
from .deprecated import (
    BroadcastInitialState,
    Checkpoint,
    LearningRateWarmup,
    MetricAverage,
    ProgressBar,
    ScaledSchedule,
    StragglerReport,
    TrackMetrics,
)
from .monitoring import StragglerMonitorCallback
from .optimizer import DistributedOptimizer, ScaledLRSchedule, is_distributed
from .progress import ProgressBarCallback
from .tracking import TrackMetricsCallback

# Names and the concepts they share with hvdkit.torch and hvdkit.tensorflow: docs/api/names.md.
__all__ = [
    "BroadcastInitialStateCallback",
    "CheckpointCallback",
    "DistributedOptimizer",
    "LearningRateWarmupCallback",
    "MetricAverageCallback",
    "PreemptionGuard",
    "ProgressBarCallback",
    "Resumed",
    "ScaledLRSchedule",
    "StragglerMonitorCallback",
    "TrackMetricsCallback",
    "Tracker",
    "average_metrics",
    "average_model_metrics",
    "batch_plan",
    "broadcast_variables",
    "communicator",
    "epoch_dataset",
    "init",
    "is_distributed",
    "is_rank0",
    "local_rank",
    "local_size",
    "rank",
    "scaled_lr",
    "shard",
    "size",
    "topology",
    # deprecated, removed in hvdkit 0.3 (the new names: docs/api/names.md)
    "BroadcastInitialState",
    "Checkpoint",
    "LearningRateWarmup",
    "MetricAverage",
    "ProgressBar",
    "ScaledSchedule",
    "StragglerReport",
    "TrackMetrics",
]
