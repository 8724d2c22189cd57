"""hvdkit for Keras 3 (TensorFlow backend): ``model.fit`` on many ranks, gradients really averaged.

    import hvdkit.keras as hk
    hk.init()
    model.compile(optimizer=hk.DistributedOptimizer(keras.optimizers.SGD(0.01)), loss=..., metrics=[...])
    ckpt = hk.Checkpoint("checkpoints/run1", model)
    model.fit(hk.shard(train_ds).batch(32), initial_epoch=ckpt.restore(), epochs=10,
              callbacks=[hk.BroadcastInitialState(), hk.MetricAverage(), ckpt],
              verbose=1 if hk.is_rank0() else 0)

Why not ``horovod.tensorflow.keras``: under Keras 3 its DistributedOptimizer hooks methods that
``fit`` never calls, so ranks train apart without any error, and its callbacks crash.
"""

from ..tensorflow import (  # noqa: F401 - one runtime for TensorFlow and Keras
    PreemptionGuard,
    average_metrics,
    broadcast_variables,
    communicator,
    epoch_dataset,
    init,
    is_rank0,
    local_rank,
    local_size,
    rank,
    shard,
    size,
    topology,
)
from ..tensorflow.data import batch_plan
from .callbacks import BroadcastInitialState, Checkpoint, LearningRateWarmup, MetricAverage, average_model_metrics
from .monitoring import StragglerReport
from .optimizer import DistributedOptimizer, ScaledSchedule, is_distributed, scaled_lr
from .progress import ProgressBar
from .tracking import TrackMetrics, Tracker

__all__ = [
    "PreemptionGuard",
    "BroadcastInitialState",
    "Checkpoint",
    "DistributedOptimizer",
    "LearningRateWarmup",
    "MetricAverage",
    "ProgressBar",
    "ScaledSchedule",
    "StragglerReport",
    "TrackMetrics",
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
]
