"""hvdkit for PyTorch: thin adapters over ``horovod.torch``.

    import hvdkit.torch as hk
    hk.init()                      # one GPU per rank where there are GPUs: hk.device()
    model.to(hk.device())
    opt = hk.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model=model)
    ckpt = hk.Checkpointer("checkpoints", model, opt)
    resumed = ckpt.restore() or hk.broadcast_state(model, opt)

Importing this module loads torch and Horovod; ``import hvdkit`` alone does not.
"""

from ._engine import horovod_torch

horovod_torch()  # fail here, loudly, when torch or Horovod's torch support is missing

# These imports come after that check (E402). The runtime's names (its __all__, star-imported) are
# exported through `*_RUNTIME` in `__all__`.
from ..core.metrics import MetricTracker  # noqa: E402
from . import elastic as elastic  # noqa: E402 - hk.elastic.State, hk.elastic.run (docs/api/torch-elastic.md)
from ._deprecated import scale_lr  # noqa: E402
from .checkpoint import Checkpointer, Resumed  # noqa: E402
from .data import EvalSampler, TrainLoader, TrainSampler, eval_loader, train_loader, train_sampler  # noqa: E402
from .monitoring import StragglerMonitor, Tracker, progress  # noqa: E402
from .optim import DistributedOptimizer, ScaledLRScheduler, amp_step, autocast  # noqa: E402
from .runtime import *  # noqa: E402, F403 - exactly its __all__, re-exported through _RUNTIME
from .runtime import __all__ as _RUNTIME  # noqa: E402
from .state import broadcast_state  # noqa: E402
from .trainer import History, Trainer  # noqa: E402

# Names and the concepts they share with hvdkit.tensorflow and hvdkit.keras: docs/api/names.md.
__all__ = [  # and the runtime's: init, rank, size, PreemptionGuard, ... (hvdkit.torch.runtime)
    *_RUNTIME,
    "Checkpointer",
    "DistributedOptimizer",
    "EvalSampler",
    "History",
    "MetricTracker",
    "Resumed",
    "ScaledLRScheduler",
    "StragglerMonitor",
    "Tracker",
    "TrainLoader",
    "Trainer",
    "TrainSampler",
    "amp_step",
    "autocast",
    "broadcast_state",
    "eval_loader",
    "progress",
    "train_loader",
    "train_sampler",
    # deprecated, removed in hvdkit 0.3 (the new names: docs/api/names.md)
    "scale_lr",
]
