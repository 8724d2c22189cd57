"""hvdkit for PyTorch: thin adapters over ``horovod.torch``.

    import hvdkit.torch as hk
    hk.init()
    opt = hk.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model=model)
    ckpt = hk.Checkpointer("checkpoints", model, opt)
    resumed = ckpt.restore() or hk.broadcast_state(model, opt)

Importing this module loads torch and Horovod; ``import hvdkit`` alone does not.
"""

from ._engine import horovod_torch

horovod_torch()  # fail here, loudly, when torch or Horovod's torch support is missing

from ..core.metrics import MetricTracker  # noqa: E402, F401
from .checkpoint import Checkpointer, Resumed  # noqa: E402
from .data import EvalSampler, TrainLoader, TrainSampler, eval_loader, train_loader, train_sampler  # noqa: E402
from .monitoring import StragglerMonitor  # noqa: E402
from .optim import DistributedOptimizer, autocast, scale_lr  # noqa: E402
from .progress import progress  # noqa: E402
from .runtime import PreemptionGuard, average_metrics, communicator, init, is_rank0, local_rank, local_size, rank, size, topology  # noqa: E402
from .state import broadcast_state  # noqa: E402
from ..core.tracking import tracker_for  # noqa: E402

Tracker = tracker_for(communicator)  # noqa: N816 - rank-0 TensorBoard/MLflow tracking (core.tracking.Tracker)


__all__ = [
    "PreemptionGuard",
    "Checkpointer",
    "DistributedOptimizer",
    "EvalSampler",
    "MetricTracker",
    "Resumed",
    "StragglerMonitor",
    "Tracker",
    "TrainLoader",
    "TrainSampler",
    "autocast",
    "average_metrics",
    "broadcast_state",
    "communicator",
    "eval_loader",
    "init",
    "is_rank0",
    "local_rank",
    "local_size",
    "progress",
    "rank",
    "scale_lr",
    "size",
    "topology",
    "train_loader",
    "train_sampler",
]
