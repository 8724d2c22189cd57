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

# The runtime's and the deprecated names are exported through `*_RUNTIME` and `*_DEPRECATED` in `__all__`,
# which ruff cannot follow (F401).
from ..tensorflow import Resumed, Tracker, batch_plan, broadcast_variables, epoch_dataset, shard
from ..tensorflow.runtime import *  # noqa: F403 - exactly its __all__, re-exported through _RUNTIME
from ..tensorflow.runtime import __all__ as _RUNTIME  # one runtime for TensorFlow and Keras
from . import elastic as elastic  # hk.elastic.fit, hk.elastic.State, hk.elastic.run (docs/api/keras-elastic.md)
from ._deprecated import (  # noqa: F401
    BroadcastInitialState,
    Checkpoint,
    LearningRateWarmup,
    MetricAverage,
    ProgressBar,
    ScaledSchedule,
    StragglerReport,
    TrackMetrics,
)
from ._deprecated import __all__ as _DEPRECATED
from .callbacks import (
    BroadcastInitialStateCallback,
    CheckpointCallback,
    LearningRateWarmupCallback,
    MetricAverageCallback,
    average_model_metrics,
)
from .monitoring import ProgressBarCallback, StragglerMonitorCallback, TrackMetricsCallback
from .optimizer import DistributedOptimizer, ScaledLRSchedule, is_distributed

# Names and the concepts they share with hvdkit.torch and hvdkit.tensorflow: docs/api/names.md.
__all__ = [  # and the TensorFlow runtime's: init, rank, size, PreemptionGuard, ...
    *_RUNTIME,
    "BroadcastInitialStateCallback",
    "CheckpointCallback",
    "DistributedOptimizer",
    "LearningRateWarmupCallback",
    "MetricAverageCallback",
    "ProgressBarCallback",
    "Resumed",
    "ScaledLRSchedule",
    "StragglerMonitorCallback",
    "TrackMetricsCallback",
    "Tracker",
    "average_model_metrics",
    "batch_plan",
    "broadcast_variables",
    "epoch_dataset",
    "is_distributed",
    "shard",
    *_DEPRECATED,  # removed in hvdkit 0.3 (the new names: docs/api/names.md)
]
