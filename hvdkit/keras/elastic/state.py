"""The state ``hk.elastic.run`` commits and restores for Keras, and the accumulation it changes at a new size."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from ...core.data import rank_seed
from ...core.errors import ConfigError
from ...core.options import check_positive_int
from ...core.recovery import CommittedState
from ...tensorflow import runtime
from ...tensorflow._engine import horovod_tf
from ...tensorflow.variables import broadcast_variables
from ..loss_scale import uses_global_loss_scale
from ..optimizer import _AveragingMixin
from ..zero import is_sharded

__all__ = ["State", "accumulation", "set_accumulation"]

_ACCUMULATOR = "_gradient_accumulator"  # Keras 3 names its accumulators <variable>_gradient_accumulator


def _optimizer(model):
    """``model``'s optimizer, checked (``_checked``)."""
    return _checked(getattr(model, "optimizer", None))


def _checked(opt):
    """``opt`` if it is hvdkit's, sharded or not (the loss-scale optimizer it makes under ``mixed_float16`` too: its
    finite check spans the ranks); else ConfigError. A Keras ``LossScaleOptimizer`` put around an hvdkit one is not
    hvdkit's (``DistributedOptimizer`` refuses it at its first ``build`` or ``apply`` as well)."""
    if isinstance(opt, keras.optimizers.LossScaleOptimizer) and not uses_global_loss_scale(opt):
        raise ConfigError(
            "hk.elastic needs the loss-scale optimizer hk.DistributedOptimizer makes (its overflow check spans the "
            "ranks), not a keras LossScaleOptimizer around it: pass "
            "hk.DistributedOptimizer(keras.optimizers.LossScaleOptimizer(opt)), or set the mixed_float16 policy first"
        )
    if not isinstance(_inner(opt), _AveragingMixin):
        raise ConfigError(
            "hk.elastic needs a model compiled with hk.DistributedOptimizer "
            f"(got {type(opt).__name__ if opt is not None else 'no optimizer'}); compile it first"
        )
    return opt


def _inner(opt):
    """The optimizer that steps: the one inside hvdkit's loss-scale optimizer, else ``opt``."""
    return opt.inner_optimizer if uses_global_loss_scale(opt) else opt


def accumulation(optimizer: keras.optimizers.Optimizer) -> int:
    """Keras's gradient accumulation steps of ``optimizer`` (1 when it does not accumulate); of a loss-scale
    optimizer, those of the optimizer inside (the wrapper itself never accumulates)."""
    return int(_inner(optimizer).gradient_accumulation_steps or 1)


def _accumulators(optimizer):
    return [v for v in optimizer.variables if v.name.endswith(_ACCUMULATOR)]


def _state_variables(optimizer):
    """The optimizer's variables that hold state (its gradient accumulators are zero between steps)."""
    return [v for v in optimizer.variables if not v.name.endswith(_ACCUMULATOR)]


def _same_everywhere(optimizer):
    """The optimizer's variables that are the same on every rank: all that hold state, a sharded one's not per
    slice (step counts, learning rates, a loss scale)."""
    return optimizer.broadcastable_variables() if is_sharded(optimizer) else _state_variables(optimizer)


def _raw_counter(optimizer):
    """Keras's raw batch counter (``iterations`` x accumulation) of the optimizer that steps. A loss-scale
    optimizer has one of its own, named alike, that never counts: it is not this one."""
    return next(v for v in _inner(optimizer).variables if v.name == "iteration")


def set_accumulation(optimizer: keras.optimizers.Optimizer, backward_passes_per_step: int) -> None:
    """Make ``hk.DistributedOptimizer``'s result apply every ``backward_passes_per_step`` batches from now on
    (the accumulation of a new world size after a recovery), by Keras's ``gradient_accumulation_steps``. Its
    batch counter is converted so that the optimizer step count (``iterations``) stays the same; call it
    between optimizer steps, then trace the train step again (``model.make_train_function(force=True)``;
    ``run`` does after every recovery). No collective.

    A built optimizer needs Keras's accumulators: it has them when it was built under in-process recovery
    (``hk.DistributedOptimizer`` makes them then, even while it does not accumulate) or with accumulation.
    """
    steps = check_positive_int("backward_passes_per_step", backward_passes_per_step)
    opt = _checked(optimizer)
    old = accumulation(opt)
    if old == steps:
        return
    if opt.built and steps > 1 and not _accumulators(opt):
        raise ConfigError(
            f"the optimizer was built without gradient accumulators, so it cannot accumulate {steps} batches; "
            "build it under `hvdkit run --recovery in-process` (hk.elastic.fit does), or with "
            "hk.DistributedOptimizer(..., backward_passes_per_step=k)"
        )
    _inner(opt).gradient_accumulation_steps = steps if steps > 1 else None  # a loss-scale wrapper reads it there
    if opt.built:
        counter = _raw_counter(opt)  # iterations x accumulation
        counter.assign(int(counter.numpy()) // old * steps)
        for v in _accumulators(opt):
            v.assign(tf.zeros_like(v))


def _host_copy(values, old):
    """NumPy copies of ``values`` (variables), written into ``old``'s arrays where they fit (no allocation)."""
    out = []
    olds = old if old is not None and len(old) == len(values) else [None] * len(values)
    for v, o in zip(values, olds, strict=True):
        a = np.asarray(v.numpy())
        if o is not None and o.shape == a.shape and o.dtype == a.dtype:
            np.copyto(o, a)
            out.append(o)
        else:
            out.append(a.copy())
    return out


class State(CommittedState):
    """What Keras training needs to go back to after a lost worker, committed in host memory.

    ``model`` is compiled with ``hk.DistributedOptimizer``. A commit holds the model's weights,
    the optimizer's variables (its step count, learning rate and slots; under ``mixed_float16`` the loss-scale
    optimizer's dynamic loss scale and its count of good steps too; not Keras's gradient accumulators, zero
    between steps), the accumulation it was made at, and the keyword ``values`` (attributes:
    ``state.epoch``; picklable, committed by value). ``seed``: the RNGs are re-seeded from
    ``(seed, step, rank)`` after every sync (``keras.utils.set_random_seed``), as a restart at another world
    size does (``step``: the value named ``step``, else 0). ``on_resize(size)`` is called on every rank at
    every sync, before the state is loaded: set there what depends on the world size (``set_accumulation``;
    a learning rate that depends on the size: at another size the committed constant rate is not loaded,
    the rate there is kept, as a restart at that size keeps the rate the script set). ``on_start()``
    (optional) runs on every rank at the job's start, when no rank has a commit (the default broadcasts
    rank 0's weights and optimizer variables).

    A sharded optimizer (``shard_optimizer_state=True``, ZeRO-1) holds a slice of the state on one rank only, so
    each commit gathers the whole, unsharded state into every rank's host memory (``consolidate(to=None)``: one
    all-gather per slot; the host then holds the unsharded optimizer state once per rank, as an unsharded
    optimizer's commit does), and every sync cuts the slices anew for the world size then (``resize()``) and
    gives each rank its slices of the newest commit, sent whole by the rank that holds it (a joining worker's
    too), so the training goes on as the unsharded optimizer's.
    Collective: ``commit``, ``commit_every`` and ``sync`` are called by every rank alike.
    """

    def __init__(
        self,
        model: keras.Model,
        *,
        seed: int = 0,
        on_resize: Callable[[int], Any] | None = None,
        on_start: Callable[[], Any] | None = None,
        **values: Any,
    ) -> None:
        super().__init__(seed=seed, on_resize=on_resize, on_start=on_start, values=values)
        self.model = model
        self.optimizer = _optimizer(model)

    def _build(self):
        if not self.optimizer.built:  # a worker that joins has not stepped yet: the same variables as the others
            self.optimizer.build(self.model.trainable_variables)

    # ------------------------------------------------------------------ commits
    def save(self) -> None:
        """Copy the state into host memory (no host check). Collective only with a sharded optimizer (it gathers
        the unsharded state to every rank)."""
        self._build()
        old = self._commit or {}
        if is_sharded(self.optimizer):  # ZeRO-1: every rank keeps the whole state, the same at any size
            optimizer = self.optimizer.consolidate(to=None)
        else:
            optimizer = _host_copy(_state_variables(self.optimizer), old.get("optimizer"))
        self._saved(
            {
                "size": runtime.size(),
                "step": int(self.optimizer.iterations.numpy()),  # optimizer steps, at any accumulation
                "model": _host_copy(list(self.model.weights), old.get("model")),
                "optimizer": optimizer,
                "values": copy.deepcopy(self.values),
            }
        )

    def check_host_updates(self) -> None:
        """Raise ``HostsUpdatedInterrupt`` on every rank alike when the driver said hosts changed. Collective."""
        from horovod.common.exceptions import HostsUpdatedInterrupt
        from horovod.runner.elastic.worker import HostUpdateResult

        removed = self._host_update(
            runtime.communicator(), int(HostUpdateResult.no_update), int(HostUpdateResult.removed)
        )
        if removed is not None:
            raise HostsUpdatedInterrupt(removed)

    # ------------------------------------------------------------------ recovery
    def restore(self) -> None:
        """Go back to the last commit, in this process (no collective; a sharded optimizer takes its slices of
        the committed state at the size it has now, and ``sync`` cuts them anew for the next)."""
        if self._commit is not None:
            self._load(self._commit)

    def _load(self, commit):
        for v, a in zip(self.model.weights, commit["model"], strict=True):
            v.assign(a)
        opt = self.optimizer
        keep_rate = commit["size"] != runtime.size()  # at another size: the rate of this size (on_resize's)
        if is_sharded(opt):
            _load_sharded(opt, commit, keep_rate)
        else:
            raw = _raw_counter(opt)
            for v, a in zip(_state_variables(opt), commit["optimizer"], strict=True):
                if v is raw:  # the raw batch counter at this accumulation
                    v.assign(commit["step"] * accumulation(opt))
                elif not (keep_rate and v.name == "learning_rate"):
                    v.assign(a)
        for v in _accumulators(opt):  # a step cut short leaves a partial sum
            v.assign(tf.zeros_like(v))
        for name, value in copy.deepcopy(commit["values"]).items():
            setattr(self, name, value)

    def sync(self) -> None:
        """Make every rank hold the newest commit of any rank (a new worker too), at this world size. Collective.

        Calls ``on_resize(size)`` first; when no rank has a commit yet (the job's start), ``on_start()``
        (or a broadcast of rank 0's weights and optimizer variables) and a first commit instead.
        """
        comm = runtime.communicator()
        if self.on_resize is not None:
            self.on_resize(comm.size)
        sharded = is_sharded(self.optimizer)
        if sharded:  # ZeRO-1: the slices of this size (empty); the state arrives below
            self.optimizer.resize()
        self._build()
        ids = comm.allgather_object(
            self._commit["id"] if self._commit is not None else -1, name="hvdkit.keras.elastic.ids"
        )
        newest = max(ids)
        if newest < 0:  # the job's start: nothing committed anywhere
            if self.on_start is not None:
                self.on_start()
            else:
                self.broadcast_from(0)
            self.save()
            return
        root = ids.index(newest)
        header = None
        if comm.rank == root:
            self._load(self._commit)  # at this size: its accumulation, its rate
            header = {"values": self._commit["values"]}
        header = comm.broadcast_object(header, name="hvdkit.keras.elastic.values", root=root)
        if sharded:  # first: broadcast_from then gives every rank the root's step count and rate, as loaded there
            _share_unsharded(self.optimizer, self._commit if comm.rank == root else None, comm.rank == root, root)
        self.broadcast_from(root)
        if comm.rank != root:
            for name, value in copy.deepcopy(header["values"]).items():
                setattr(self, name, value)
            for v in _accumulators(self.optimizer):
                v.assign(tf.zeros_like(v))
        step = int(getattr(self, "step", 0) or 0)
        keras.utils.set_random_seed(rank_seed(self.seed, step, comm.rank) & 0xFFFFFFFF)
        self._commit_id = newest
        self.save()  # every rank (a new worker too) holds the state it goes on from

    def broadcast_from(self, root: int) -> None:
        """Give every rank ``root``'s weights and optimizer variables (not its accumulators; of a sharded optimizer
        those that are not per slice: each rank's slots are its own slice): what ``sync`` does at the job's start
        without ``on_start``, and what an ``on_start`` that found nothing to restore does.
        Collective: every rank calls it."""
        broadcast_variables(list(self.model.weights) + _same_everywhere(self.optimizer), root)

    def on_reset(self) -> None:
        """After Horovod re-formed the ring (``run`` calls it): forget host notices of the old ring, and trace
        the train step again (its collectives and accumulation belong to the world size it was traced at)."""
        super().on_reset()
        if getattr(self.model, "train_function", None) is not None:
            self.model.make_train_function(force=True)


def _rates(optimizer):
    """The optimizer's learning-rate variables (a loss-scale optimizer has one of its own besides the inner one's)."""
    return [v for v in _same_everywhere(optimizer) if v.name == "learning_rate"]


def _load_sharded(opt, commit, keep_rate):
    """A commit's unsharded optimizer state into a sharded optimizer: this rank's slices, the step count at this
    accumulation, and at another size the learning rate of this size (no collective)."""
    kept = [(v, v.numpy()) for v in _rates(opt)] if keep_rate else []
    opt.load_unsharded(commit["optimizer"])
    _raw_counter(opt).assign(commit["step"] * accumulation(opt))
    for v, value in kept:
        v.assign(value)


def _share_unsharded(opt, commit, is_root, root):
    """Send ``root``'s committed unsharded optimizer state to every rank, one variable at a time (a broadcast
    each); every other rank keeps its slices of it (``load_unsharded``). The root has loaded it already.
    Collective: every rank calls it, with the same optimizer (``unsharded_specs`` alike)."""
    hvd = horovod_tf()

    def received():
        for i, (shape, dtype) in enumerate(opt.unsharded_specs()):
            value = commit["optimizer"][i] if is_root else np.zeros(shape, dtype)
            yield hvd.broadcast(tf.convert_to_tensor(value), root, name=f"hvdkit.keras.elastic.optimizer.{i}").numpy()

    if is_root:
        for _ in received():
            pass
    else:
        opt.load_unsharded(list(received()))  # every broadcast made before any slice is taken
