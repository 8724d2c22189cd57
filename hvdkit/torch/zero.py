"""Optimizer-state sharding (ZeRO stage 1) on Horovod's reduce-scatter and all-gather.

Each param group's trainable parameters are seen as one flat vector; rank ``r`` owns the slice
``partition(length, size)[r]`` of it (``hvdkit.core.zero``, shared with ``hvdkit.keras.zero``), cut
the way Horovod's ``reducescatter`` cuts a first dimension (balanced; the first ``length % size``
ranks hold one element more). ``step()``
reduce-scatters the gradients, lets an inner optimizer of the user's class update only this rank's
slice (so its ``state`` holds about ``1/size`` of the unsharded state) and all-gathers the updated
slices back into the parameters. Only optimizers whose update is elementwise can be cut this way.
The parameters and gradients live in one flat buffer each per group (``hvdkit.torch.zero_flat``):
no step makes a whole-size copy of either; the collectives move them in rounds of at most
``round_elements`` elements.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import time
from collections.abc import Callable
from typing import Any

import torch

from ..core.errors import ConfigError
from ..core.options import check_positive_int
from ..core.zero import CHUNK_ELEMENTS, ROUND_ELEMENTS, Piece, Slice, partition, plan_rounds, rank_parts
from . import elastic
from ._engine import horovod_torch
from .zero_flat import FlatGroup
from .zero_overlap import EarlyRounds, round_order
from .zero_state import ShardedOptimizerState, elements

__all__ = [
    "CHUNK_ELEMENTS",
    "ROUND_ELEMENTS",
    "ELEMENTWISE_OPTIMIZERS",
    "ShardedOptimizer",
    "Slice",
    "check_shardable",
    "elements",
    "partition",
    "release_freed_memory",
]

# torch optimizers whose update of an element reads only that element's parameter, gradient and state
# (plus scalars: step counts, learning rate), so a slice updated alone equals the same slice of the whole.
ELEMENTWISE_OPTIMIZERS = (
    torch.optim.SGD,
    torch.optim.Adam,
    torch.optim.AdamW,
    torch.optim.Adamax,
    torch.optim.NAdam,
    torch.optim.RAdam,
    torch.optim.RMSprop,
    torch.optim.Adagrad,
    torch.optim.Adadelta,
    torch.optim.ASGD,
)


@functools.cache
def _malloc_trim():
    """glibc's ``malloc_trim``, or None where the C library has none (musl, macOS)."""
    name = ctypes.util.find_library("c")
    try:
        return ctypes.CDLL(name).malloc_trim if name else None
    except (OSError, AttributeError):
        return None


def release_freed_memory() -> bool:
    """Hand the C heap's free memory back to the system (glibc ``malloc_trim(0)``); False where there is none.

    The rounds of a sharded step allocate and free blocks below glibc's mmap threshold (which it
    raises up to 32 MiB after a large free), from several threads' arenas: glibc keeps those freed
    blocks resident unless told, and the resident set then grows by what the rounds freed.
    """
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True


def check_shardable(optimizer: torch.optim.Optimizer) -> None:
    """Raise ConfigError unless ``optimizer``'s class is one whose state can be sharded (elementwise update).

    No collective: every rank raises alike, so a refused optimizer cannot hang the job.
    """
    if type(optimizer) not in ELEMENTWISE_OPTIMIZERS:
        allowed = ", ".join(c.__name__ for c in ELEMENTWISE_OPTIMIZERS)
        raise ConfigError(
            f"shard_optimizer_state=True cannot shard {type(optimizer).__name__}: only optimizers whose update "
            f"is elementwise can update a slice of the parameters alone ({allowed}); "
            "pass shard_optimizer_state=False to keep the whole state on every rank"
        )
    for i, group in enumerate(optimizer.param_groups):
        _check_group(i, group)


def _check_group(i, group):
    kinds = {(p.dtype, p.device) for p in group["params"] if p.requires_grad}
    if len(kinds) > 1:
        raise ConfigError(
            f"shard_optimizer_state=True needs one dtype and device per param group (group {i} mixes "
            f"{sorted(str(k) for k in kinds)}); put parameters of each dtype in a group of their own"
        )


_NO_SYNCHRONIZE = (
    "{call} of a sharded optimizer (shard_optimizer_state=True): its step() reduce-scatters the gradients, so "
    "each rank only ever holds its slice of the averaged gradient and clip_grad_norm_ between synchronize() "
    "and step() would clip by this rank's own gradients. To clip, pass hk.DistributedOptimizer(..., "
    "max_grad_norm=1.0) (the global norm, taken from the slices) and call opt.step(); for fp16 loss scaling "
    "use hk.amp_step(opt, scaler); for other edits of the averaged gradients use shard_optimizer_state=False"
)


class ShardedOptimizer(ShardedOptimizerState):
    """A torch optimizer whose state is sharded over the ranks (ZeRO stage 1); ``hk.DistributedOptimizer`` makes it.

    ``param_groups`` are the user's, with the user's parameters (schedulers and ``zero_grad`` act on
    them as usual); ``state`` is the inner optimizer's, over this rank's slices only. ``step()``
    reduce-scatters the gradients (``op``, fp16 on the wire with ``compression="fp16"``), clips them
    to ``max_grad_norm`` by their global norm (taken from the slices: one allreduce of the sum of
    squares; left in ``last_grad_norm``), updates this rank's slices and all-gathers them into the
    parameters, so every rank ends with bitwise the same parameters. Gradients of
    ``backward_passes_per_step`` ``backward()`` calls accumulate in ``.grad`` and are reduced once;
    a round of that reduce-scatter starts during the last backward pass, as soon as the gradients it
    needs are complete (``hvdkit.torch.zero_overlap``; ``overlap = False`` leaves it all to ``step()``),
    and ``last_rounds["overlapped"]`` says how many rounds did. More passes than that before
    ``step()`` raise ConfigError, as in Horovod; ``zero_grad()`` drops rounds started without a step.
    The trainable parameters are those that require a gradient when their group is added: one unfrozen
    later is a ConfigError naming it (at the next backward or ``step()``); add unfrozen layers as a new
    group with ``add_param_group`` instead (torch's fine-tuning recipe), which plans their slices anew.

    Memory: each group's trainable parameters become views of one flat buffer (the same
    ``Parameter`` objects; ``channels_last`` ones turn contiguous) and their gradients views of
    another, kept across ``zero_grad()``; ``zero_grad(set_to_none=True)`` still leaves ``p.grad``
    None until the next backward fills the buffer again. After ``step()`` this rank's slice of the
    gradients holds the averaged gradient, the rest its local one. The reduce-scatter and
    all-gather work on the buffers in rounds of at most ``round_elements`` elements over all ranks
    (``last_rounds`` says how many and the largest), after each of which the C heap's freed blocks
    are handed back to the system (``release_freed_memory``; ``trim_memory = False`` skips it);
    build this optimizer after ``model.to(...)``.

    Its state (``state_dict``, ``load_state_dict``, ``consolidate_state_dict``, ``share_state``: the
    unsharded optimizer's, any world size) is its base class's, ``hvdkit.torch.zero_state``.

    Collective: construction, ``step()`` and ``consolidate_state_dict()`` on every rank alike.
    """

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        compression: str = "none",
        op: str = "average",
        max_grad_norm: float | None = None,
        backward_passes_per_step: int = 1,
        named_parameters: list[tuple[str, torch.Tensor]] | None = None,
    ) -> None:
        check_shardable(optimizer)
        check_positive_int("backward_passes_per_step", backward_passes_per_step)
        self.backward_passes_per_step = backward_passes_per_step
        self._hvd = hvd = horovod_torch()
        self._rank, self._size = hvd.rank(), hvd.size()
        self.compression = compression
        self._op = hvd.Average if op == "average" else hvd.Sum
        self.max_grad_norm = None if max_grad_norm is None else float(max_grad_norm)
        self.last_grad_norm = None
        self._listeners = []
        self._names = {id(p): name for name, p in named_parameters or ()}  # for error messages
        self._consolidated = None  # the whole state, valid until the next step() (see state_dict)
        self._consolidated_to = None  # the rank consolidate_state_dict() gathered it to, where not this one
        self.chunk_elements = CHUNK_ELEMENTS
        self.last_consolidation = None
        self.last_scatter = None
        self._built = False  # torch's __init__ adds the user's groups through add_param_group
        super().__init__(optimizer.param_groups, optimizer.defaults)
        self.round_elements = ROUND_ELEMENTS
        self.trim_memory = True
        self.last_rounds = None
        self._groups = [FlatGroup(g["params"], self._rank, self._size, i) for i, g in enumerate(self.param_groups)]
        self.overlap = True
        self._early = EarlyRounds(self)
        self._inner = type(optimizer)(
            [dict(self._hyper(g), params=[s.shard]) for g, s in zip(self.param_groups, self._groups, strict=True)]
        )
        self.state = self._inner.state
        self._trained = {id(p) for g in self._groups for p in g.params}
        # State an optimizer makes at construction (Adagrad) for frozen parameters: kept whole, as unsharded.
        frozen = [p for g in self.param_groups for p in g["params"] if not p.requires_grad]
        self._frozen_state = {p: optimizer.state[p] for p in frozen if p in optimizer.state}
        if self._inner.state:  # made at construction (Adagrad): a fresh state_dict() needs it whole
            self.consolidate_state_dict(to=None)
        else:
            self._consolidated = {}
        self._built = True

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """As torch's (e.g. layers unfrozen while fine-tuning): the group gets flat buffers and a slice of its own.

        Its parameters start without state, as in torch. Call it between a ``step()`` (or
        ``zero_grad()``) and the next backward pass. Collective: every rank adds the same group at the
        same point (no communication, but the next ``step()`` reduces the new group too).
        """
        if not self._built:
            super().add_param_group(param_group)
            return
        if self._early.busy():
            raise ConfigError(
                "add_param_group() on a sharded optimizer while rounds of the gradient reduce-scatter are in "
                "flight: call it after step() or zero_grad(), before the next backward pass"
            )
        super().add_param_group(param_group)
        index = len(self.param_groups) - 1
        group = self.param_groups[index]
        try:
            _check_group(index, group)
        except ConfigError:
            self.param_groups.pop()
            raise
        flat = FlatGroup(group["params"], self._rank, self._size, index)
        self._groups.append(flat)
        self._early.watch(flat)
        self._inner.add_param_group(dict(self._hyper(group), params=[flat.shard]))
        self._trained.update(id(p) for p in flat.params)

    def resize(self) -> None:
        """Cut the slices anew for the ranks of the job now (``hvdkit.torch.elastic``, after a recovery or a join).

        The flat buffers, this rank's slices and the inner optimizer are rebuilt; the optimizer state is
        dropped: load the unsharded state next (``load_state_dict`` on the rank that holds it, then
        ``share_state``). Rounds of a step cut short are forgotten (Horovod was restarted). The gradient
        hooks of the old buffers stay registered and do nothing. No collective.
        """
        self._rank, self._size = self._hvd.rank(), self._hvd.size()
        for group in self.param_groups:
            for p in group["params"]:
                p.grad = None
        self._groups = [FlatGroup(g["params"], self._rank, self._size, i) for i, g in enumerate(self.param_groups)]
        self._early = EarlyRounds(self)
        self._inner = type(self._inner)(
            [dict(self._hyper(g), params=[s.shard]) for g, s in zip(self.param_groups, self._groups, strict=True)]
        )
        self.state = self._inner.state
        self._trained = {id(p) for g in self._groups for p in g.params}
        self._consolidated, self._consolidated_to = {}, None
        self.last_rounds = None

    def check_trainable(self) -> None:
        """Raise ConfigError naming a parameter that requires a gradient now but did not when its group was added.

        Its elements have no place in the flat buffers and slices, so it would never be updated (a layer
        unfrozen after the optimizer was built). ``step()`` calls it, and the first gradient hook of a
        backward pass before any round starts; it reads only ``requires_grad`` (the same on every rank), so
        every rank raises alike, before any collective.
        """
        for gi, group in enumerate(self.param_groups):
            for pi, p in enumerate(group["params"]):
                if p.requires_grad and id(p) not in self._trained:
                    name = self._names.get(id(p))
                    what = f"{name!r} (" if name else "("
                    raise ConfigError(
                        f"parameter {what}param group {gi}, position {pi}, shape {tuple(p.shape)}) requires a "
                        "gradient now but was frozen (requires_grad=False) when the sharded optimizer was built, "
                        "so it has no slice and would never be updated. Unfreeze it before building "
                        "hk.DistributedOptimizer(..., shard_optimizer_state=True); or leave it out of the "
                        "optimizer and add it when unfreezing it: opt.add_param_group({'params': [...]}); or "
                        "rebuild the optimizer after unfreezing"
                    )

    def add_synchronize_listener(self, listener: Callable[[float], Any]) -> None:
        """Call ``listener(seconds)`` after every gradient reduce-scatter with the seconds it took."""
        if not callable(listener):
            raise ConfigError(f"listener must be callable with the seconds (got {type(listener).__name__})")
        self._listeners.append(listener)

    def synchronize(self) -> None:
        """Refused with ConfigError: each rank holds only its slice of the averaged gradient, never all of it.

        Horovod's recipe ``opt.synchronize(); clip_grad_norm_(...); with opt.skip_synchronize(): opt.step()``
        would clip by each rank's own gradients. The message names the replacement: ``max_grad_norm=``
        (clipping by the global norm, taken from the slices), ``hk.amp_step`` for fp16 loss scaling, or
        ``shard_optimizer_state=False`` for other edits of the averaged gradients. No collective.
        """
        raise ConfigError(_NO_SYNCHRONIZE.format(call="synchronize()"))

    def skip_synchronize(self) -> None:
        """Refused with ConfigError as ``synchronize()`` is (the other half of Horovod's recipe). No collective."""
        raise ConfigError(_NO_SYNCHRONIZE.format(call="skip_synchronize()"))

    def zero_grad(self, set_to_none: bool = True) -> None:
        """As torch's; rounds of the reduce-scatter started during a backward without a ``step()`` are
        waited for and dropped first (every rank started them, so every rank must finish them)."""
        self._early.drain(self)
        super().zero_grad(set_to_none=set_to_none)

    # ------------------------------------------------------------ step
    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        """Reduce-scatter the gradients, update this rank's slices, all-gather the parameters.

        Collective: every rank calls it the same number of times.
        """
        elastic.check_inside_run("the optimizer's step()")  # under --recovery in-process: a recoverable loop
        self.check_trainable()
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self._reduce()
        if self.max_grad_norm is not None:
            self.last_grad_norm = self._clip(self.max_grad_norm)
        self._update()
        return loss

    @torch.no_grad()
    def amp_step(self, scaler: torch.amp.GradScaler) -> None:
        """``hk.amp_step``'s sharded form: reduce-scatter, unscale, agree on inf/NaN, clip, step, update.

        ``scaler.unscale_`` looks for inf/NaN in this rank's slices only; their flags are summed over
        the ranks (one allreduce) and put back into the scaler, so ``scaler.step`` skips the update on
        every rank together and ``scaler.update()`` changes the scale alike on every rank, as the
        unsharded optimizer does with its averaged gradients. Collective: every rank calls it.
        """
        if not scaler.is_enabled():
            self.step()
            return
        self.check_trainable()
        self._reduce()
        scaler.unscale_(self._inner)
        state = scaler._per_optimizer_states[id(self._inner)]  # what torch's FSDP ShardedGradScaler edits too
        found = state["found_inf_per_device"]
        local = sum((v.detach().float().cpu() for v in found.values()), torch.zeros(()))
        total = self._hvd.allreduce(local, name="hvdkit.zero.found_inf", op=self._hvd.Sum)
        devices = list(found) or [self._groups[0].shard.device if self._groups else torch.device("cpu")]
        state["found_inf_per_device"] = {d: total.to(device=d, dtype=torch.float32) for d in devices}
        if self.max_grad_norm is not None:
            self.last_grad_norm = self._clip(self.max_grad_norm)
        self._sync_hyper()
        scaler.step(self._inner)  # skips the update where the summed flags say inf/NaN
        if float(total) == 0:  # the same on every rank: all step and all-gather, or none
            self._all_gather()
        scaler.update()

    def _reduce(self):
        self._consolidated, self._consolidated_to = None, None
        for g in self._groups:  # the parameters may have been set since the last step (p.data = ..., a restore)
            g.prepare()
        self._reduce_scatter()

    def _sync_hyper(self):
        for group, inner in zip(self.param_groups, self._inner.param_groups, strict=True):
            inner.update(self._hyper(group))

    def _update(self):
        self._sync_hyper()
        self._inner.step()
        self._all_gather()

    def _active(self):
        """The groups with trainable parameters (a group of frozen ones takes no part in collectives)."""
        return [g for g in self._groups if g.params]

    # ------------------------------------------------------------ rounds (also hvdkit.torch.zero_overlap's)
    @property
    def flat_groups(self) -> tuple[FlatGroup, ...]:
        """One ``FlatGroup`` per param group, in order: its flat buffers and this rank's slice (read them only)."""
        return tuple(self._groups)

    @property
    def early_rounds(self) -> EarlyRounds:
        """The rounds of the gradient reduce-scatter started during backward (``hvdkit.torch.zero_overlap``)."""
        return self._early

    def round_plan(self) -> tuple[list[FlatGroup], list[list[Piece]]]:
        """The groups with trainable parameters and the rounds of the step's collectives over them.

        ``hvdkit.core.zero.plan_rounds`` with ``round_elements``: the same plan on every rank, each
        ``Piece``'s group an index into the groups returned. No collective.
        """
        check_positive_int("round_elements", self.round_elements)
        groups = self._active()
        return groups, plan_rounds([g.offsets[-1] for g in groups], self._size, self.round_elements)

    def start_round(self, groups: list[FlatGroup], round_: list[Piece], n: int) -> Any:
        """Start round ``n`` of the gradient reduce-scatter (``round_``, ``groups``: from ``round_plan()``); no wait.

        Packs every rank's part of each piece from the gradient buffers (fp16 with ``compression="fp16"``)
        and hands them to Horovod's asynchronous grouped reduce-scatter; returns its handle, for
        ``finish_round`` or ``drop_round``. Collective: every rank starts round ``n`` (its name is fixed
        by ``n``), in the same order.
        """
        return self._hvd.grouped_reducescatter_async(
            self._packs(groups, round_), name=f"hvdkit.zero.grads.{n}", op=self._op
        )

    def finish_round(self, groups: list[FlatGroup], round_: list[Piece], handle: Any) -> None:
        """Wait for a round ``start_round`` started; write this rank's reduced part into its slice of the gradients."""
        self._write_back(groups, round_, self._hvd.synchronize(handle))

    def drop_round(self, handle: Any) -> None:
        """Wait for a round ``start_round`` started and drop what it reduced (every rank started it: all must wait)."""
        self._hvd.synchronize(handle)

    def _packs(self, groups, round_):
        """One temporary per piece of ``round_``: every rank's part of it, in rank order (fp16 with compression)."""
        packs = []
        for piece in round_:
            g = groups[piece.group]
            pack = torch.cat([g.grads[a:b] for a, b in rank_parts(g.bounds, piece)])
            packs.append(pack.to(torch.float16) if self.compression == "fp16" else pack)
        return packs

    def _write_back(self, groups, round_, outs):
        """This rank's reduced part of each piece of ``round_`` into its slice of the gradient buffer."""
        for piece, out in zip(round_, outs, strict=True):
            g = groups[piece.group]
            a, b = rank_parts(g.bounds, piece)[self._rank]
            g.grads[a:b].copy_(out)

    def _reduce_scatter(self):
        """Reduce this rank's slice of the gradient buffers over the ranks, in place (a missing gradient counts 0).

        In rounds: each packs every rank's part of its pieces into one temporary, which the engine
        reduce-scatters; this rank's reduced part is written back into its slice of the buffer.
        Rounds started during backward (``hvdkit.torch.zero_overlap``) are waited for; the others are
        reduced here, in ``round_order`` as the backward hooks start them (so no rank waits for a round
        another rank has not started).
        """
        start = time.perf_counter()
        groups, rounds = self.round_plan()
        early = self._early
        largest = 0
        for n in round_order(len(rounds)):
            round_ = rounds[n]
            largest = max(
                largest, sum(len(range(*part)) for p in round_ for part in rank_parts(groups[p.group].bounds, p))
            )
            if n in early.finished:
                continue
            if early.in_flight(n):
                early.finish(self, n)
                continue
            packs = self._packs(groups, round_)
            outs = self._hvd.grouped_reducescatter(packs, name=f"hvdkit.zero.grads.{n}", op=self._op)
            del packs
            self._write_back(groups, round_, outs)
            del outs  # freed before the heap is trimmed
        self.last_rounds = {"rounds": len(rounds), "largest_round": largest, "overlapped": early.started}
        early.reset()
        if self.trim_memory:
            release_freed_memory()
        seconds = time.perf_counter() - start
        for listener in self._listeners:
            listener(seconds)

    def _clip(self, max_norm):
        """Scale the slices' gradients so that the whole gradient's 2-norm is at most ``max_norm``; the norm before."""
        grads = [g.shard.grad for g in self._active()]
        local = sum((gr.double().pow(2).sum() for gr in grads), torch.zeros((), dtype=torch.float64))
        total = self._hvd.allreduce(local, name="hvdkit.zero.grad_norm", op=self._hvd.Sum)
        norm = total.sqrt().to(torch.float32)
        coef = torch.clamp(max_norm / (norm + 1e-6), max=1.0)
        for gr in grads:
            gr.mul_(coef.to(gr.dtype))
        return norm

    def _all_gather(self):
        """Every rank's updated slice into every rank's parameter buffers, in rounds (as ``_reduce_scatter``)."""
        groups, rounds = self.round_plan()
        for n, round_ in enumerate(rounds):
            sends = []
            for piece in round_:
                g = groups[piece.group]
                a, b = rank_parts(g.bounds, piece)[self._rank]
                sends.append(g.flat[a:b])
            outs = self._hvd.grouped_allgather(sends, name=f"hvdkit.zero.params.{n}")
            for piece, out in zip(round_, outs, strict=True):
                g = groups[piece.group]
                at = 0
                for r, (a, b) in enumerate(rank_parts(g.bounds, piece)):
                    if r != self._rank:  # this rank's part is already in place
                        g.flat[a:b].copy_(out[at : at + b - a])
                    at += b - a
            del outs, out
        if self.trim_memory:
            release_freed_memory()
