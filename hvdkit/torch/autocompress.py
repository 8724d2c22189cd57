"""``compression="auto"`` for torch: time fp32 and fp16 allreduces of the gradients' shapes, keep the faster.

    from hvdkit.torch.autocompress import measure_and_choose
    decision = measure_and_choose(model)          # or a list of tensors / shapes
    decision.choice, decision.fp32_s, decision.fp16_s, decision.as_dict()

``measure_and_choose`` is also what the network benchmark records at each link rate. The pure
decision and the precedence (argument > HVDKIT_COMPRESSION > measurement) live in
``hvdkit.core.autocompress``.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Sequence

import torch

from ..core import env as _env
from ..core.autocompress import (
    DEFAULT_MARGIN,
    Decision,
    decide,
    fp32_bytes,
    median,
    reps_for,
    resolve_compression,
    wanted_compression,
)
from ..core.errors import ConfigError
from ..core.log import get_logger
from ..core.options import check_positive_int
from ._engine import horovod_torch

__all__ = ["measure_and_choose", "resolve", "time_compressions"]

_log = get_logger("autocompress")


def _shapes(what):
    """The gradient shapes of a module, an optimizer, or a list of tensors / shapes."""
    if isinstance(what, torch.nn.Module):
        return [tuple(p.shape) for p in what.parameters() if p.requires_grad]
    if isinstance(what, torch.optim.Optimizer):
        return [tuple(p.shape) for g in what.param_groups for p in g["params"] if p.requires_grad]
    try:
        items = list(what)
    except TypeError:
        raise ConfigError(
            f"expected a torch.nn.Module, an optimizer or a list of tensors or shapes (got {type(what).__name__})"
        ) from None
    return [tuple(t.shape) if isinstance(t, torch.Tensor) else tuple(int(d) for d in t) for t in items]


def _device(what):
    """Where ``what``'s gradients live (its first parameter or tensor's device): the collectives to
    time are the ones training will run, NCCL for CUDA tensors. A list of shapes: the CPU."""
    if isinstance(what, torch.nn.Module):
        tensors = what.parameters()
    elif isinstance(what, torch.optim.Optimizer):
        tensors = (p for g in what.param_groups for p in g["params"])
    else:
        tensors = (t for t in what if isinstance(t, torch.Tensor)) if isinstance(what, (list, tuple)) else ()
    return next(iter(tensors), torch.zeros(0)).device


def time_compressions(
    shapes: Sequence[Sequence[int]],
    reps: int | None = None,
    name: str = "hvdkit.autocompress",
    device: str | torch.device = "cpu",
) -> tuple[float, float, int, int]:
    """``(fp32_s, fp16_s, nbytes, tensors)``: seconds per grouped allreduce of zeros of ``shapes`` on ``device``.

    fp16 includes the casts to half and back, as ``compression="fp16"`` does per gradient. One
    untimed warm-up each, then ``reps`` of each interleaved (A B A B ...); each figure is the
    slowest rank's median, so every rank returns the same numbers. ``reps`` defaults to
    ``hvdkit.core.autocompress.reps_for(bytes)`` (5 to 25).
    Collective: every rank calls it with the same shapes and ``reps``.
    """
    hvd = horovod_torch()
    nbytes = fp32_bytes(shapes)
    reps = reps_for(nbytes) if reps is None else check_positive_int("reps", reps)
    fp32 = [torch.zeros(s, device=device) for s in shapes]
    on_gpu = torch.device(device).type == "cuda"  # a GPU collective is done when its stream is
    if not fp32:
        raise ConfigError("no gradients to time: the model has no parameters that require a gradient")

    def fp32_op():
        hvd.grouped_allreduce_(fp32, op=hvd.Average, name=f"{name}.fp32")
        if on_gpu:
            torch.cuda.synchronize(device)

    def fp16_op():
        wire = [t.to(torch.float16) for t in fp32]
        hvd.grouped_allreduce_(wire, op=hvd.Average, name=f"{name}.fp16")
        back = [w.to(torch.float32) for w in wire]
        if on_gpu:
            torch.cuda.synchronize(device)
        return back

    times = {fp32_op: [], fp16_op: []}
    for op in times:
        op()  # warm-up: negotiation, buffers
    for _ in range(reps):
        for op, samples in times.items():
            start = time.perf_counter()
            op()
            samples.append(time.perf_counter() - start)
    local = torch.tensor([median(times[fp32_op]), median(times[fp16_op])], dtype=torch.float64)
    slowest = hvd.allreduce(local, op=hvd.Max, name=f"{name}.times")
    return float(slowest[0]), float(slowest[1]), nbytes, len(fp32)


def measure_and_choose(
    what: torch.nn.Module | torch.optim.Optimizer | Iterable[torch.Tensor | Sequence[int]],
    reps: int | None = None,
    margin: float = DEFAULT_MARGIN,
) -> Decision:
    """Time fp32 and fp16 allreduces of ``what``'s gradient shapes; the Decision (``.choice``: "none"/"fp16").

    ``what``: a ``torch.nn.Module``, a torch optimizer, or a list of tensors or shapes. Horovod must
    be initialised (``hvdkit.torch.init()``). Ignores HVDKIT_COMPRESSION (it only measures).
    Collective: every rank calls it with the same shapes.
    """
    fp32_s, fp16_s, nbytes, tensors = time_compressions(_shapes(what), reps, device=_device(what))
    return Decision(decide(fp32_s, fp16_s, margin), fp32_s, fp16_s, nbytes, tensors, margin)


def resolve(
    compression: str, what: torch.nn.Module | torch.optim.Optimizer | Iterable[torch.Tensor | Sequence[int]]
) -> str:
    """``"none"`` or ``"fp16"`` for ``DistributedOptimizer(compression=...)``; measures when it is ``"auto"``.

    An explicit ``"none"``/``"fp16"`` is returned as is; ``"auto"`` takes HVDKIT_COMPRESSION when
    set, else ``measure_and_choose(what)``; rank 0 logs the choice with both times.
    Collective: with ``"auto"`` every rank must call it (the optimizer's constructor does).
    Env: HVDKIT_COMPRESSION.
    """
    hvd = horovod_torch()
    size = hvd.size() if hvd.is_initialized() else 1
    log = _log.info if size == 1 or hvd.rank() == 0 else None
    if compression == "auto" and os.environ.get(_env.RECOVERY) == "in-process":
        # no timing collectives: a worker that joins builds its optimizer while the others wait in the sync
        chosen = wanted_compression(compression)
        chosen = "none" if chosen == "auto" else chosen
        if log is not None:
            log(
                f"compression auto under in-process recovery: {chosen} (not timed: a worker that joins the job "
                "cannot take part in the timing); pass compression='fp16' or HVDKIT_COMPRESSION=fp16 for half "
                "the bytes"
            )
        return chosen

    def measure():
        return time_compressions(_shapes(what), device=_device(what))

    def agree(wanted):
        return hvd.broadcast_object(wanted, root_rank=0, name="hvdkit.autocompress.wanted")

    return resolve_compression(compression, measure, size, log=log, agree=agree)[0]
