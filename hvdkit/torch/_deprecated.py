"""hvdkit.torch's deprecated names, kept for one release (removed in hvdkit 0.3): each warns, then works.

The renamed keyword arguments of ``TrainSampler``/``EvalSampler`` (``rank_``, ``size_``,
``num_replicas``) are handled where they are taken (``hvdkit.core.deprecation.renamed_argument``).
"""

from ..core.deprecation import deprecated_function
from .optim import ScaledLRScheduler

__all__ = ["scale_lr"]

scale_lr = deprecated_function(ScaledLRScheduler, "hvdkit.torch.scale_lr", "hvdkit.torch.ScaledLRScheduler")
