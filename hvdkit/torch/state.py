"""Making every rank hold one rank's model, optimizer and small state: fresh start and resume alike.

The root describes what it holds in a small header (names, shapes, dtypes, and every non-tensor
value) that is broadcast as an object; the tensors follow as tensors, in bounded chunks, straight
into the model's own parameters and buffers on the other ranks (``Communicator.broadcast_tensors``).
Nothing is pickled whole, so a state of any size costs about one chunk of extra memory.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from ..core.errors import CollectiveError
from .runtime import communicator

if TYPE_CHECKING:
    from ..core.comm import Communicator

__all__ = ["broadcast_state", "share_state"]


@dataclass(frozen=True)
class _TensorSpec:
    """Where a header holds a tensor: its index in the tensor list, shape, dtype and device type."""

    index: int
    shape: tuple
    dtype: torch.dtype
    device: str = "cpu"  # "cuda": a receiving rank makes its copy on its own current GPU


def split_tensors(obj, tensors):
    """``obj`` with every tensor moved to ``tensors`` and replaced by its ``_TensorSpec``."""
    if isinstance(obj, torch.Tensor):
        tensors.append(obj)
        return _TensorSpec(len(tensors) - 1, tuple(obj.shape), obj.dtype, obj.device.type)
    if isinstance(obj, dict):
        return type(obj)((k, split_tensors(v, tensors)) for k, v in obj.items())
    if isinstance(obj, (list, tuple)) and not hasattr(obj, "_fields"):
        return type(obj)(split_tensors(v, tensors) for v in obj)
    return obj


def join_tensors(obj, tensors):
    """The inverse of ``split_tensors``: every ``_TensorSpec`` replaced by its tensor."""
    if isinstance(obj, _TensorSpec):
        return tensors[obj.index]
    if isinstance(obj, dict):
        return type(obj)((k, join_tensors(v, tensors)) for k, v in obj.items())
    if isinstance(obj, (list, tuple)) and not hasattr(obj, "_fields"):
        return type(obj)(join_tensors(v, tensors) for v in obj)
    return obj


def tensor_specs(obj):
    """Every ``_TensorSpec`` in ``obj``, in ``split_tensors`` order."""
    if isinstance(obj, _TensorSpec):
        return [obj]
    if isinstance(obj, dict):
        obj = list(obj.values())
    if isinstance(obj, (list, tuple)):
        return [s for v in obj for s in tensor_specs(v)]
    return []


def describe_state(
    model: torch.nn.Module | None, optimizer: torch.optim.Optimizer | None, rest: Any
) -> tuple[dict[str, Any], list[torch.Tensor]]:
    """On the root: ``(header, tensors)`` for ``receive_state`` (``rest``: any picklable data).

    The tensors are the model's own parameters and buffers, the optimizer's own state and the
    tensors in ``rest``: nothing is copied.
    """
    tensors = []
    header = {
        "model": split_tensors(model.state_dict(), tensors) if model is not None else None,
        "optimizer": split_tensors(optimizer.state_dict(), tensors) if optimizer is not None else None,
        "rest": split_tensors(rest, tensors),
    }
    return header, tensors


def _fit_error(header, model, optimizer, root):
    """Why this rank's model or optimizer cannot take the root's state, or None."""
    if (header["model"] is None) != (model is None) or (header["optimizer"] is None) != (optimizer is None):
        return f"a model and optimizer were passed on rank {root} and not here, or the other way round"
    if model is not None:
        own, theirs = model.state_dict(), header["model"]
        if list(own) != list(theirs):
            missing, unexpected = sorted(set(theirs) - set(own)), sorted(set(own) - set(theirs))
            return (
                f"the model's entries differ from rank {root}'s "
                f"(missing here: {missing[:5]}, only here: {unexpected[:5]})"
            )
        for key, spec in theirs.items():
            if isinstance(spec, _TensorSpec) and (tuple(own[key].shape), own[key].dtype) != (spec.shape, spec.dtype):
                here = f"{tuple(own[key].shape)} {own[key].dtype}"
                return f"model entry {key!r} is {here} here, {spec.shape} {spec.dtype} on rank {root}"
    if optimizer is not None:
        own = [len(g["params"]) for g in optimizer.param_groups]
        theirs = [len(g["params"]) for g in header["optimizer"]["param_groups"]]
        if own != theirs:
            return f"the optimizer has parameter groups of sizes {own} here, {theirs} on rank {root}"
    return None


def receive_state(
    comm: Communicator,
    header: dict[str, Any],
    tensors: list[torch.Tensor] | None,
    model: torch.nn.Module | None = None,
    optimizer: torch.optim.Optimizer | None = None,
    root: int = 0,
    error: type[Exception] = CollectiveError,
) -> Any:
    """Give every rank the root's state described by ``header``; returns the root's ``rest``.

    ``tensors`` is what ``describe_state`` returned on the root (ignored elsewhere). The other
    ranks check that their model and optimizer fit (all ranks raise ``error`` if any does not),
    receive the model's tensors in place, and load the optimizer state with ``load_state_dict``.
    Collective: every rank calls it after the header was broadcast; names are fixed here.
    """
    if comm.size == 1:
        return join_tensors(header["rest"], tensors)
    is_root = comm.rank == root
    problem = None if is_root else _fit_error(header, model, optimizer, root)
    raise_unless_all_fit(comm, problem, "hvdkit.state.fit", error, f"rank {root}'s state", "model and optimizer")
    if not is_root:
        tensors = _targets(header, model)
    comm.broadcast_tensors(tensors, name="hvdkit.state.tensors", root=root)
    if not is_root and optimizer is not None:
        optimizer.load_state_dict(join_tensors(header["optimizer"], tensors))
    return join_tensors(header["rest"], tensors)


def raise_unless_all_fit(
    comm: Communicator, problem: str | None, name: str, error: type[Exception], what: str, same: str
) -> None:
    """Gather every rank's ``problem`` (None: it fits); raise ``error`` on every rank naming the first that does not.

    Collective: every rank calls it with the same ``name``.
    """
    problems = comm.allgather_object(problem, name=name)
    bad = [(r, p) for r, p in enumerate(problems) if p]
    if bad:
        r, p = bad[0]
        raise error(f"rank {r} cannot take {what}: {p}; every rank must build the same {same}")


def _targets(header, model):
    """Where a non-root rank receives each tensor: its model's own tensors, new ones for the rest."""
    specs = tensor_specs([header["model"], header["optimizer"], header["rest"]])
    tensors = [None] * len(specs)
    own = model.state_dict() if model is not None else {}
    for key, spec in (header["model"] or {}).items():
        if isinstance(spec, _TensorSpec):
            tensors[spec.index] = own[key]
    for spec in specs:
        if tensors[spec.index] is None:
            # optimizer state on the root's GPU arrives on this rank's GPU (Horovod needs one device type)
            tensors[spec.index] = torch.empty(spec.shape, dtype=spec.dtype, device=spec.device)
    return tensors


def share_state(
    comm: Communicator,
    model: torch.nn.Module | None = None,
    optimizer: torch.optim.Optimizer | None = None,
    extra: Any = None,
    root: int = 0,
    error: type[Exception] = CollectiveError,
) -> Any:
    """Make every rank hold ``root``'s model, optimizer state and ``extra``; returns ``root``'s ``extra``.

    The one path by which ranks take one rank's state: a fresh start (``broadcast_state``) and a
    resume (``Checkpointer.restore``, after rank 0 loaded the checkpoint) alike. A failure on the
    root, or a rank whose model or optimizer does not fit the root's, raises ``error`` on every rank.
    Collective: every rank calls it; names are fixed here.
    """
    sharded = optimizer if hasattr(optimizer, "share_state") else None  # ZeRO: each rank takes only its slice
    if sharded is not None:
        optimizer = None
    outcome, tensors = None, None
    if comm.rank == root:
        try:
            header, tensors = describe_state(model, optimizer, {"extra": extra})
            outcome = ("ok", header)
        except Exception as e:  # noqa: BLE001 - any failure must reach every rank
            outcome = ("error", f"rank {root} could not describe its state ({type(e).__name__}: {e})")
    status, header = comm.broadcast_object(outcome, name="hvdkit.state.header", root=root)
    if status != "ok":
        raise error(header)
    extra = receive_state(comm, header, tensors, model, optimizer, root, error)["extra"]
    if sharded is not None:
        sharded.share_state(comm, root, error)
    return extra


def broadcast_state(
    model: torch.nn.Module | None = None,
    optimizer: torch.optim.Optimizer | None = None,
    extra: Any = None,
    root_rank: int = 0,
) -> Any:
    """Copy ``root_rank``'s model parameters and buffers, optimizer state and ``extra`` to every rank.

    Returns ``root_rank``'s ``extra`` (any picklable object; other ranks may pass anything, of any
    type, e.g. None). Every collective has a name fixed by hvdkit, never derived from a value,
    so ranks that pass objects of different types do not hang (Horovod's ``broadcast_object``
    names the collective after the object's type by default).
    The tensors are sent as tensors, in bounded chunks, into the model's own parameters and
    buffers; the optimizer state arrives through ``load_state_dict``. Unlike Horovod's
    ``broadcast_optimizer_state`` no fake zero-gradient step is taken on a fresh optimizer, so
    Adam's step count and weight decay are not touched. A rank whose model or optimizer does not
    match ``root_rank``'s makes every rank raise CollectiveError.

    Collective: every rank calls it with the same kind of model and optimizer.
    """
    return share_state(communicator(), model, optimizer, extra, root_rank)
