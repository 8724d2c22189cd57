"""Gradient averaging for torch optimizers, delegated to Horovod; clipping and LR scaling around it."""

from __future__ import annotations

import math
import time
from typing import Any

import torch

from ..core.errors import ConfigError, MissingDependencyError
from ..core.log import get_logger
from ..core.lr import check_warmup_steps, lr_scale, warmup_factor
from ..core.options import check_positive_int
from . import autocompress, buckets, elastic, zero
from ._engine import horovod_torch

__all__ = ["DistributedOptimizer", "ScaledLRScheduler", "amp_step", "autocast"]

_OPS = ("average", "sum")
_log = get_logger("lr")


def DistributedOptimizer(  # noqa: N802 - mirrors Horovod
    optimizer: torch.optim.Optimizer,
    model: torch.nn.Module | None = None,
    compression: str = "none",
    backward_passes_per_step: int = 1,
    op: str = "average",
    max_grad_norm: float | None = None,
    shard_optimizer_state: bool = False,
    bucket_mb: float | str | None = "auto",
) -> torch.optim.Optimizer:
    """Wrap ``optimizer`` so that ``step()`` applies gradients averaged over all ranks.

    The result is Horovod's own ``horovod.torch.DistributedOptimizer`` (ring-allreduce, tensor
    fusion), configured by name:

    - ``compression``: ``"none"`` (exact fp32), ``"fp16"`` (half the bytes on the wire; the
      average is taken in fp16 and cast back) or ``"auto"`` (time both on these gradients' shapes
      now, keep fp16 only if > 10 % faster; HVDKIT_COMPRESSION overrides; ``hvdkit.torch.autocompress``).
      The result's ``compression`` attribute says what it uses: ``"none"`` or ``"fp16"``.
    - ``backward_passes_per_step``: gradients of that many ``backward()`` calls are summed locally
      and averaged over ranks once, before ``step()``. As in Horovod the local sum is not divided:
      scale the loss by ``1 / backward_passes_per_step`` to train on the mean.
    - ``op``: ``"average"`` (default) or ``"sum"``.
    - ``model``: gives the collectives the parameters' names (recommended; otherwise the order of
      ``optimizer.param_groups`` names them, which is the same on every rank).
    - ``max_grad_norm``: clip the *averaged* gradient to this total 2-norm before every update, so
      clipping sees the gradient of the global batch and acts identically on every rank. ``step()``
      then does ``synchronize()``, ``torch.nn.utils.clip_grad_norm_(params, max_grad_norm)``,
      and the update without a second synchronisation; the norm before clipping (the same on every
      rank) is left in ``optimizer.last_grad_norm``. Do not call ``clip_grad_norm_`` yourself between
      ``backward()`` and ``step()``: the gradients are still the rank's own there (and Horovod may
      be reading them). The manual equivalent, for other per-gradient edits, is
      ``opt.synchronize(); edit grads; with opt.skip_synchronize(): opt.step()`` (unsharded only: a
      sharded optimizer holds only its slice of the averaged gradients, and both calls raise ConfigError
      naming ``max_grad_norm``, the clipping it does itself).

    - ``shard_optimizer_state``: ZeRO stage 1 (``hvdkit.torch.zero.ShardedOptimizer``): each rank
      keeps the optimizer state of a 1/size slice of every param group only; gradients are
      reduce-scattered and the updated slices all-gathered (the bytes of one allreduce). For torch's
      elementwise optimizers (SGD, Adam, AdamW, ...; others raise ConfigError). ``state_dict()``
      stays the unsharded one, so checkpoints (``hk.Checkpointer``) restore at any world size,
      sharded or not (the restore sends each rank only its slice). The reduce-scatter overlaps
      the backward pass: a round starts once the last gradient it needs has arrived on the
      ``backward_passes_per_step``-th pass (``hvdkit.torch.zero_overlap``); ``step()`` finishes it.
      Layers unfrozen later join with ``opt.add_param_group``; a parameter frozen when it was built and
      unfrozen later is a ConfigError at the next backward or ``step()`` naming it.

    - ``bucket_mb``: average the gradients in buckets of about this many MiB, in backward order, as
      DDP does with 25 (the first bucket 1 MiB), each bucket one grouped allreduce started as soon as
      its last gradient is ready (Horovod's ``groups``; ``hvdkit.torch.buckets``); the result is
      bitwise the unbucketed one. None or 0: every gradient goes to Horovod on its own and its
      tensor fusion groups them. ``"auto"`` (default): 25 where the parameters are on a GPU (measured
      on an H200: 1.04-1.05x DDP's step on ResNet-50 and BERT-base, docs/gpu.md), none on the CPU or
      with a sparse embedding. The plan, in bytes per bucket, is left in ``bucket_sizes``.
      A parameter in a bucket must get a gradient on every rank or on none in a step (a layer that
      no rank uses is fine; one skipped on some ranks only is not, as with DDP's buckets: pass
      ``bucket_mb=0`` there). Not with ``shard_optimizer_state`` (ConfigError; ``"auto"`` is none there).

    A parameter frozen (``requires_grad=False``) when the unsharded optimizer is built and unfrozen
    later (progressive unfreezing) is averaged too, in ``synchronize()`` (not overlapped with backward).

    Unsharded, the result is an instance of a subclass of Horovod's class that adds
    ``add_synchronize_listener(listener)``: ``listener(seconds)`` is called after every
    ``synchronize()`` (the one inside ``step()`` too) with the time it took, mostly spent waiting
    for the other ranks' gradients (``hk.StragglerMonitor(optimizer=opt)`` uses it).

    Collective: every rank must call ``step()`` the same number of times (and construct it, with ``"auto"``).
    Env: HVDKIT_COMPRESSION (with ``compression="auto"``).
    """
    hvd = horovod_torch()
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise ConfigError(
            f"optimizer must be a torch.optim.Optimizer (got {type(optimizer).__name__}); "
            "create it first, e.g. torch.optim.SGD(model.parameters(), lr=0.1)"
        )
    if shard_optimizer_state and bucket_mb == "auto":
        bucket_mb = None
    devices = [p.device for group in optimizer.param_groups for p in group["params"] if p.requires_grad]
    sparse = isinstance(model, torch.nn.Module) and any(getattr(m, "sparse", False) is True for m in model.modules())
    bucket_mb = buckets.resolve_bucket_mb(bucket_mb, devices, sparse=sparse)
    if shard_optimizer_state and bucket_mb is not None:
        raise ConfigError(
            f"bucket_mb={bucket_mb:g} cannot be combined with shard_optimizer_state=True: ZeRO-1 reduce-scatters "
            "in rounds of its own; drop bucket_mb"
        )
    if shard_optimizer_state:
        zero.check_shardable(optimizer)  # before any collective: every rank refuses alike
    compression = autocompress.resolve(compression, optimizer)  # "auto": timed once here, collectively
    check_positive_int("backward_passes_per_step", backward_passes_per_step)
    if op not in _OPS:
        raise ConfigError(f"op must be one of {_OPS} (got {op!r})")
    named = None
    if model is not None:
        if not isinstance(model, torch.nn.Module):
            raise ConfigError(f"model must be a torch.nn.Module (got {type(model).__name__})")
        named = list(model.named_parameters())
    if max_grad_norm is not None:
        _check_max_norm(max_grad_norm)
    if shard_optimizer_state:  # its collectives have fixed names: it needs no parameter names
        return zero.ShardedOptimizer(
            optimizer,
            compression=compression,
            op=op,
            max_grad_norm=max_grad_norm,
            backward_passes_per_step=backward_passes_per_step,
            named_parameters=named,
        )
    if max_grad_norm is not None:
        optimizer = _clipping_copy(optimizer)
    groups = None if bucket_mb is None else buckets.plan_buckets(optimizer.param_groups, bucket_mb)
    wrapped = _listening_optimizer(
        hvd,
        optimizer,
        named_parameters=named,
        compression=hvd.Compression.fp16 if compression == "fp16" else hvd.Compression.none,
        backward_passes_per_step=backward_passes_per_step,
        op=hvd.Average if op == "average" else hvd.Sum,
        groups=groups,
    )
    wrapped.bucket_sizes = None if groups is None else [sum(p.numel() * p.element_size() for p in b) for b in groups]
    if max_grad_norm is not None:
        wrapped.max_grad_norm = float(max_grad_norm)
    wrapped.compression = compression  # what "auto" chose, for logs and result lines
    return wrapped


class _SynchronizeListeners:
    """Mixin over the class Horovod builds: ``synchronize()`` tells listeners how long it took."""

    def __init__(self, *args, **kwargs):
        self._synchronize_listeners = []
        super().__init__(*args, **kwargs)

    def add_synchronize_listener(self, listener):
        """Call ``listener(seconds)`` after every ``synchronize()`` with the seconds it took."""
        if not callable(listener):
            raise ConfigError(f"listener must be callable with the seconds (got {type(listener).__name__})")
        self._synchronize_listeners.append(listener)

    def synchronize(self):
        elastic.check_inside_run("the optimizer's step()")  # under --recovery in-process: a loop it can recover
        start = time.perf_counter()
        try:
            return super().synchronize()
        finally:
            seconds = time.perf_counter() - start
            for listener in self._synchronize_listeners:
                listener(seconds)


class _AverageLateTrainable:
    """Mixin over the class Horovod builds: parameters unfrozen after construction are averaged too.

    Horovod hooks only the parameters that require a gradient when it is built: one unfrozen later
    (progressive unfreezing) would be updated with each rank's own gradient and the ranks would drift
    apart. ``synchronize()`` first averages those in one grouped allreduce of a fixed name, with the
    optimizer's op and compression (a missing gradient counts zero, as for Horovod's own parameters);
    which parameters they are depends only on ``requires_grad``, the same on every rank.
    """

    def __init__(self, params, **options):
        params = list(params)
        self._built_trainable = {id(p) for group in params for p in group["params"] if p.requires_grad}
        self._late_options = (options["compression"], options["op"])
        super().__init__(params, **options)

    def synchronize(self):
        late = [
            p
            for group in self.param_groups
            for p in group["params"]
            if p.requires_grad and id(p) not in self._built_trainable
        ]
        if late:
            _average_late(late, *self._late_options)
        return super().synchronize()


def _average_late(params, compression, op):
    """Average the gradients of ``params`` over the ranks in place (None: zeros), in one grouped allreduce."""
    hvd = horovod_torch()
    packed = []
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
        packed.append(compression.compress(p.grad.contiguous()))
    outs = hvd.grouped_allreduce([t for t, _ in packed], name="hvdkit.late_trainable", op=op)
    for p, (_, ctx), out in zip(params, packed, outs, strict=True):
        p.grad.copy_(compression.decompress(out, ctx))


def _listening_optimizer(hvd, optimizer, **options):
    """``hvd.DistributedOptimizer(optimizer, **options)``, as an instance of a subclass with listeners
    that also averages parameters unfrozen after construction.

    Horovod's class is built by its factory; it is taken from a probe over a one-element tensor
    without gradient (no hooks, no collective), then constructed the way the factory does, from
    ``optimizer``'s param groups. Engine fix 75 makes that class subclassable.
    """
    probe_base = type(optimizer)([dict(optimizer.param_groups[0], params=[torch.zeros(1)])])
    horovod_class = type(hvd.DistributedOptimizer(probe_base))
    bases = (_SynchronizeListeners, _AverageLateTrainable, horovod_class)
    cls = type(horovod_class.__name__, bases, {"__module__": __name__})
    try:
        return cls(optimizer.param_groups, **options)
    except (RecursionError, TypeError) as e:  # the base class was built from its param groups above
        raise MissingDependencyError(
            f"the installed Horovod predates hvdkit's engine fix 75: its optimizer class cannot be "
            f"subclassed ({type(e).__name__}: {str(e)[:200]}); run `make setup` to rebuild it"
        ) from e


def _check_max_norm(value):
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise ConfigError(f"max_grad_norm must be a finite number > 0 or None (got {value!r}); e.g. max_grad_norm=1.0")


class _ClipAveragedGradients:
    """Mixin under Horovod's optimizer class: its ``step()`` clips the gradients, then updates.

    Horovod's ``step()`` averages the gradients (``synchronize()``, skipped inside the user's
    ``skip_synchronize()`` where they are averaged already) and then calls the wrapped optimizer's
    ``step()``, which is this one: it clips the averaged gradients, the same on every rank, before
    the update. A closure has already run before the averaging (Horovod evaluates it first).
    """

    max_grad_norm = None
    last_grad_norm = None

    def step(self, closure=None):
        if self.max_grad_norm is not None:
            self.last_grad_norm = _clip_grads(self, self.max_grad_norm)
        return super().step(closure)


_CLIPPING_CLASSES = {}


def _clipping_copy(optimizer):
    """An optimizer of ``optimizer``'s class plus ``_ClipAveragedGradients``, on the same param groups.

    Horovod builds its optimizer from the class and param groups of the one it is given, as here;
    the clipping class is made once per optimizer class.
    """
    base = type(optimizer)
    if base not in _CLIPPING_CLASSES:
        _CLIPPING_CLASSES[base] = type(base.__name__, (_ClipAveragedGradients, base), {"__module__": base.__module__})
    return _CLIPPING_CLASSES[base](optimizer.param_groups)


def _clip_grads(optimizer, max_norm):
    """Clip the gradients ``optimizer`` holds now to ``max_norm`` in total; their norm before.

    The list is taken after averaging: a parameter unused on this rank in this step has a gradient
    only once Horovod has averaged in the other ranks' (taken before, it would be left out of this
    rank's norm, the ranks would clip by different factors and drift apart).
    """
    params = [p for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
    return torch.nn.utils.clip_grad_norm_(params, max_norm)


CARRIED_SCALE = "hvdkit_lr_scale"  # in each param group: the rule's scale its "lr" carries


class ScaledLRScheduler(torch.optim.lr_scheduler.LRScheduler):
    """A scheduler that scales ``optimizer``'s single-process rate for the job's ranks, with warmup.

    The rate of every param group goes from its value now (``base_lr``, tuned for one process with
    the per-rank batch) to ``base_lr * scale`` linearly over ``warmup_steps`` optimizer steps
    (Goyal et al.; no warmup when 0), then stays; ``scale`` is ``size`` for ``rule="linear"``,
    ``sqrt(size)`` for ``"sqrt"``, 1 for ``"none"`` (``hvdkit.core.lr``). Call ``sched.step()``
    after every ``optimizer.step()``, as for any torch scheduler:

        opt = hk.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model=model)
        sched = hk.ScaledLRScheduler(opt, rule="linear", warmup_steps=500)   # lr 0.1 -> 0.1 * size
        decay = torch.optim.lr_scheduler.StepLR(opt, step_size=1000, gamma=0.5)  # optional, on top
        for x, y in loader:
            ...; opt.step(); sched.step(); decay.step()

    It is chainable: other chainable schedulers stepped on the same optimizer multiply on top
    (``lr(t) = base_lr * warmup_factor(t) * their factor``). Closed-form schedulers such as
    ``LambdaLR`` overwrite the rate instead; put their factor in the lambda and use this one alone.
    Its state (``state_dict``) checkpoints like any scheduler's; restored in a job with another
    number of ranks (elastic shrink or grow), the rule is re-applied for the new size (see
    ``load_state_dict``). ``size`` defaults to the job's. With a fixed global batch
    (``hk.train_loader(..., global_batch_size=)``) the batch does not change with the ranks: use
    ``rule="none"`` or no scaling. The rate alone, as a number: ``hk.scaled_lr``; the Keras
    counterpart: ``hvdkit.keras.ScaledLRSchedule``.
    """

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        rule: str = "linear",
        warmup_steps: int = 0,
        size: int | None = None,
        last_epoch: int = -1,
    ) -> None:
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise ConfigError(f"optimizer must be a torch.optim.Optimizer (got {type(optimizer).__name__})")
        if size is None:
            from .runtime import size as job_size

            size = job_size()
        # Only scale and warmup_steps are kept: state_dict() saves every attribute, and a restored
        # size or rule would overwrite this job's.
        self.scale = lr_scale(size, rule)
        self.warmup_steps = check_warmup_steps(warmup_steps)
        super().__init__(optimizer, last_epoch)
        for group in optimizer.param_groups:
            group[CARRIED_SCALE] = self.scale

    def factor(self, step: int) -> float:
        """The multiplier of the optimizer's initial rate at ``step`` (``hvdkit.core.lr.warmup_factor``)."""
        return warmup_factor(step, self.warmup_steps, self.scale)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load a saved state; saved at another world size, the rule is re-applied for this one.

        The optimizer's rates (restored before this) carry the saved run's factor; they are
        multiplied by ``factor(t)`` at this job's scale over ``factor(t)`` at the saved scale, so
        warmup position and any chained schedule carry over. Logged on rank 0. Each param group
        records the scale its rate carries (``CARRIED_SCALE``, saved with the optimizer), so loading
        the same state twice rescales once.
        """
        scale = self.scale
        super().load_state_dict(state_dict)
        saved, self.scale = self.scale, scale
        t = max(self.last_epoch, 0)
        ratios = []
        for group in self.optimizer.param_groups:
            carried = group.get(CARRIED_SCALE, saved)  # optimizer states saved before the carried scale lack it
            ratios.append(warmup_factor(t, self.warmup_steps, scale) / warmup_factor(t, self.warmup_steps, carried))
            group["lr"] *= ratios[-1]
            group[CARRIED_SCALE] = scale
        self._last_lr = [group["lr"] for group in self.optimizer.param_groups]
        if _on_rank0() and any(r != 1.0 for r in ratios):
            _log.info(
                "learning-rate rule re-applied for this world size: scale %g (saved run) -> %g, rates x %s, now %s",
                saved,
                scale,
                ", ".join(f"{r:g}" for r in ratios),
                ", ".join(f"{lr:.6g}" for lr in self._last_lr),
            )

    def get_lr(self) -> list[float]:
        # Chainable (like MultiplicativeLR): multiply the current rate by this step's change of factor,
        # so schedulers stepped on the same optimizer (StepLR, ExponentialLR, ...) multiply on top.
        t = self.last_epoch
        ratio = self.factor(t) / (self.factor(t - 1) if t > 0 else 1.0)
        return [group["lr"] * ratio for group in self.optimizer.param_groups]


def _on_rank0():
    """True on rank 0, and in a process that has not started Horovod (a single process)."""
    hvd = horovod_torch()
    return not hvd.is_initialized() or hvd.rank() == 0


_DTYPES = {"bfloat16": torch.bfloat16, "bf16": torch.bfloat16, "float16": torch.float16, "fp16": torch.float16}


def autocast(enabled: bool = True, dtype: str = "bfloat16", device_type: str | None = None) -> torch.autocast:
    """``torch.autocast`` for the forward pass: bf16 by default, fp16 with ``dtype="float16"``.

    ``device_type``: default the rank's device (``hk.device()``: ``"cuda"`` on a GPU rank, ``"cpu"``
    before ``init()`` or without GPUs). Parameters stay fp32, so their gradients are fp32 and the
    optimizer wrapper averages them as usual: run the forward pass and the loss inside the context,
    ``backward()`` and ``step()`` outside it. fp16 needs loss scaling: see ``amp_step``.
    """
    if dtype not in _DTYPES:
        raise ConfigError(f"dtype must be one of {sorted(_DTYPES)} (got {dtype!r})")
    if device_type is None:
        from . import runtime

        device_type = runtime._device.type if runtime._device is not None else "cpu"
    return torch.autocast(device_type=device_type, dtype=_DTYPES[dtype], enabled=enabled)


def amp_step(optimizer: torch.optim.Optimizer, scaler: torch.amp.GradScaler) -> torch.Tensor | None:
    """One update of fp16 mixed precision with a ``torch.amp.GradScaler``, in the order Horovod needs.

        scaler = torch.amp.GradScaler("cuda")
        opt = hk.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model=model, max_grad_norm=1.0)
        for x, y in loader:
            opt.zero_grad()
            with hk.autocast(dtype="float16"):
                loss = loss_fn(model(x), y)
            scaler.scale(loss).backward()
            hk.amp_step(opt, scaler)

    It waits for the averaged gradients (``synchronize()``), unscales them (``scaler.unscale_``), lets
    the optimizer clip them if it was made with ``max_grad_norm`` and update without averaging again
    (``skip_synchronize()``; ``scaler.step`` skips the update when a gradient is inf or NaN: the
    averaged gradients are the same on every rank, so every rank skips together), then adjusts the
    scale (``scaler.update()``). This avoids Horovod's AMP traps: ``scaler.step(opt)`` alone would
    unscale gradients still being averaged, and unscaling before ``synchronize()`` makes Horovod
    average them a second time. Returns the averaged gradient norm before clipping when the
    optimizer clips (``optimizer.last_grad_norm``), else None. A sharded optimizer
    (``shard_optimizer_state=True``) holds only its slice of the averaged gradients: it reduce-scatters
    them, unscales its slice and sums the inf/NaN flags over the ranks before stepping, so every rank
    skips (and rescales) together.

    Collective: every rank calls it once per step, as ``step()``.
    """
    if isinstance(optimizer, zero.ShardedOptimizer):  # its own order: the inf/NaN flags agreed over the ranks
        optimizer.amp_step(scaler)
        return optimizer.last_grad_norm if optimizer.max_grad_norm is not None else None
    if not hasattr(optimizer, "skip_synchronize"):
        raise ConfigError(
            f"amp_step needs the optimizer hk.DistributedOptimizer returns (got {type(optimizer).__name__}); "
            "for one process without Horovod use scaler.step(optimizer); scaler.update()"
        )
    optimizer.synchronize()
    scaler.unscale_(optimizer)
    with optimizer.skip_synchronize():
        scaler.step(optimizer)
    scaler.update()
    return getattr(optimizer, "last_grad_norm", None) if getattr(optimizer, "max_grad_norm", None) else None
