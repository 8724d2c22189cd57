"""Gradient averaging for torch optimizers, delegated to Horovod."""

import torch

from ..core.errors import ConfigError
from ..core.options import check_compression, check_positive_int
from ._engine import horovod_torch

__all__ = ["DistributedOptimizer", "autocast"]

_OPS = ("average", "sum")


def DistributedOptimizer(optimizer, model=None, compression="none", backward_passes_per_step=1, op="average"):  # noqa: N802 - mirrors Horovod
    """Wrap ``optimizer`` so that ``step()`` applies gradients averaged over all ranks.

    The result is Horovod's own ``horovod.torch.DistributedOptimizer`` (ring-allreduce, tensor
    fusion), configured by name:

    - ``compression``: ``"none"`` (exact fp32) or ``"fp16"`` (half the bytes on the wire; the
      average is taken in fp16 and cast back).
    - ``backward_passes_per_step``: gradients of that many ``backward()`` calls are summed locally
      and averaged over ranks once, before ``step()``. As in Horovod the local sum is not divided:
      scale the loss by ``1 / backward_passes_per_step`` to train on the mean.
    - ``op``: ``"average"`` (default) or ``"sum"``.
    - ``model``: gives the collectives the parameters' names (recommended; otherwise the order of
      ``optimizer.param_groups`` names them, which is the same on every rank).

    Collective: every rank must call ``step()`` the same number of times.
    """
    hvd = horovod_torch()
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise ConfigError(
            f"optimizer must be a torch.optim.Optimizer (got {type(optimizer).__name__}); "
            "create it first, e.g. torch.optim.SGD(model.parameters(), lr=0.1)"
        )
    compression = check_compression(compression)
    check_positive_int("backward_passes_per_step", backward_passes_per_step)
    if op not in _OPS:
        raise ConfigError(f"op must be one of {_OPS} (got {op!r})")
    named = None
    if model is not None:
        if not isinstance(model, torch.nn.Module):
            raise ConfigError(f"model must be a torch.nn.Module (got {type(model).__name__})")
        named = list(model.named_parameters())
    return hvd.DistributedOptimizer(
        optimizer,
        named_parameters=named,
        compression=hvd.Compression.fp16 if compression == "fp16" else hvd.Compression.none,
        backward_passes_per_step=backward_passes_per_step,
        op=hvd.Average if op == "average" else hvd.Sum,
    )


_DTYPES = {"bfloat16": torch.bfloat16, "bf16": torch.bfloat16, "float16": torch.float16, "fp16": torch.float16}


def autocast(enabled=True, dtype="bfloat16", device_type="cpu"):
    """``torch.autocast`` for the forward pass (bf16 on CPU by default).

    Parameters stay fp32, so their gradients are fp32 and the optimizer wrapper averages them as
    usual: run the forward pass and the loss inside the context, ``backward()`` and ``step()``
    outside it.
    """
    if dtype not in _DTYPES:
        raise ConfigError(f"dtype must be one of {sorted(_DTYPES)} (got {dtype!r})")
    return torch.autocast(device_type=device_type, dtype=_DTYPES[dtype], enabled=enabled)
