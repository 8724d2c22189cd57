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
    """``opt`` if it is hvdkit's and unsharded (the loss-scale optimizer it makes under ``mixed_float16`` too: its
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
    if is_sharded(opt):
        raise ConfigError(
            "hk.elastic does not support shard_optimizer_state=True for Keras yet; pass shard_optimizer_state=False"
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

    ``model`` is compiled with ``hk.DistributedOptimizer`` (not sharded). A commit holds the model's weights,
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
        """Copy the state into host memory (no host check, no collective)."""
        self._build()
        old = self._commit or {}
        self._saved(
            {
                "size": runtime.size(),
                "step": int(self.optimizer.iterations.numpy()),  # optimizer steps, at any accumulation
                "model": _host_copy(list(self.model.weights), old.get("model")),
                "optimizer": _host_copy(_state_variables(self.optimizer), old.get("optimizer")),
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
        """Go back to the last commit, in this process (no collective)."""
        if self._commit is not None:
            self._load(self._commit)

    def _load(self, commit):
        for v, a in zip(self.model.weights, commit["model"], strict=True):
            v.assign(a)
        opt = self.optimizer
        keep_rate = commit["size"] != runtime.size()  # at another size: the rate of this size (on_resize's)
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
        """Give every rank ``root``'s weights and optimizer variables (not its accumulators): what ``sync`` does at
        the job's start without ``on_start``, and what an ``on_start`` that found nothing to restore does.
        Collective: every rank calls it."""
        broadcast_variables(list(self.model.weights) + _state_variables(self.optimizer), root)

    def on_reset(self) -> None:
        """After Horovod re-formed the ring (``run`` calls it): forget host notices of the old ring, and trace
        the train step again (its collectives and accumulation belong to the world size it was traced at)."""
        super().on_reset()
        if getattr(self.model, "train_function", None) is not None:
            self.model.make_train_function(force=True)
