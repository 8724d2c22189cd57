"""In-process recovery (``hvdkit run --recovery in-process``): training state committed in memory, restored
in the processes that are left after a worker is lost, without a restart or a disk read.

The job runs under Horovod's own elastic driver (Gloo). ``hk.Trainer`` uses this module by itself; a
hand-written loop puts its state in an ``hk.elastic.State`` and its loop in a function under
``@hk.elastic.run``::

    state = hk.elastic.State(model, opt, objects={"sched": sched}, epoch=0, step=0, samples_done=0)

    @hk.elastic.run
    def train(state):                       # called again after every recovery, from the last commit
        loader = hk.train_loader(train_set, 32, global_batch_size=64, seed=0)   # at this world size
        hk.elastic.set_accumulation(opt, loader.accumulation)
        for epoch in range(state.epoch, EPOCHS):
            loader.sampler.set_epoch(epoch, start=state.samples_done)
            for i, (x, y) in enumerate(loader, 1):
                ...                         # backward of loss / loader.accumulation
                if i % loader.accumulation == 0:
                    opt.step(); opt.zero_grad(); state.step += 1
                    state.samples_done = loader.position(i // loader.accumulation)
                    state.commit_every(50)  # in memory; also where a new worker joins
            state.epoch, state.samples_done = epoch + 1, 0
            state.commit()

    train(state)

What a commit holds: the model, the optimizer, every object of ``objects`` (anything with
``state_dict()``/``load_state_dict()``: schedulers, ``hk.ScaledLRScheduler``, a GradScaler), the plain
values given as keywords (attributes of the state); the RNGs are re-seeded from ``(seed, step, rank)``
after a recovery, as a restart at another world size does. Every rank keeps its own
copy in host memory (the model and optimizer are the same on every rank); a sharded optimizer
(ZeRO-1) is gathered to every rank at each commit (a collective; host memory: the whole optimizer
state on every rank), and after a recovery cut into slices for the new size (``resize()``).
After a lost worker the others go back to their last commit, Horovod re-forms the ring at the smaller
size, ``on_resize(size)`` rebuilds what depends on the world size, and the rank with the newest commit
gives it to every rank (a new worker too). Nothing collective may run before ``run``: a worker that
joins runs the script's start while the others wait in ``sync`` (hvdkit's own constructors, the
Trainer's and the Checkpointer's, hold none under in-process recovery).
Outside ``--recovery in-process`` the same script runs as a plain job: ``run`` calls the function once.
"""

from __future__ import annotations

import copy
import functools
import os
from collections.abc import Callable, Mapping
from typing import Any

import torch

from ..core import env as _env
from ..core import recovery
from ..core.checkpoint.tree import reseed_rng
from ..core.errors import ConfigError
from ..core.log import get_logger
from ..core.recovery import CommittedState, begin_recovery, recover_in_process, reset_with_retries, say_recovered
from ..core.zero import ShardedState
from . import runtime
from ._engine import horovod_torch
from .state import share_state

__all__ = ["CommitSchedule", "State", "check_inside_run", "in_process", "inside_run", "run", "set_accumulation"]

_log = get_logger("elastic")
_inside = [0]  # how many hk.elastic.run calls this thread is in


def in_process(environ: Mapping[str, str] | None = None) -> bool:
    """True when ``hvdkit run --recovery in-process`` started this rank (HVDKIT_RECOVERY=in-process)."""
    return (os.environ if environ is None else environ).get(_env.RECOVERY) == "in-process"


def inside_run() -> bool:
    """True inside a function that ``hk.elastic.run`` runs (``hk.Trainer.fit`` under in-process recovery too)."""
    return _inside[0] > 0


def check_inside_run(what: str) -> None:
    """ConfigError when this rank runs under ``--recovery in-process`` but trains outside ``hk.elastic.run``.

    Such a script would run as a fixed-size job under Horovod's elastic driver: the first lost worker
    would end it with nothing to go back to. ``what`` names the call that found it (e.g. ``step()``).
    """
    if in_process() and not inside_run():
        raise ConfigError(
            f"{what} was called outside hk.elastic.run, but this job was started by `hvdkit run --recovery "
            "in-process`, which recovers only training state it knows: train with hk.Trainer (no change needed), "
            "or put the loop in a function decorated with @hk.elastic.run and its state in an hk.elastic.State "
            "(README, 'In-process recovery'); or start the job with --recovery restart"
        )


class State(CommittedState):
    """What a training loop needs to go back to after a lost worker, committed in host memory.

    ``model`` (a ``torch.nn.Module``) and ``optimizer`` (``hk.DistributedOptimizer``'s result, sharded or
    not; or None), ``objects`` (``{name: obj}`` with ``state_dict()``/``load_state_dict()``, loaded after
    the optimizer in this order, so an ``hk.ScaledLRScheduler`` re-applies its rule at the new size),
    ``seed`` (the RNGs are re-seeded from ``(seed, step, rank)`` after a recovery, as a restart at another
    world size does; ``step`` is the value named ``step``, else 0) and ``on_resize(size)`` (called on
    every rank after each recovery, before the state is shared: rebuild the data loader and what else
    depends on the world size). Keyword ``values`` become attributes (``state.epoch``); they must be
    picklable, and are committed and restored by value.

    ``on_start()`` (optional) runs once on every rank before the first commit, when no rank has one:
    restore a checkpoint or broadcast rank 0's state there (the default broadcasts model and optimizer).
    Collective: ``commit``, ``commit_every``, ``sync`` are called by every rank alike.
    """

    def __init__(
        self,
        model: torch.nn.Module | None,
        optimizer: torch.optim.Optimizer | None = None,
        *,
        objects: Mapping[str, Any] | None = None,
        seed: int = 0,
        on_resize: Callable[[int], Any] | None = None,
        on_start: Callable[[], Any] | None = None,
        **values: Any,
    ) -> None:
        super().__init__(seed=seed, on_resize=on_resize, on_start=on_start, values=values)
        self.model = model
        self.optimizer = optimizer
        self.objects = dict(objects or {})

    # ------------------------------------------------------------------ commits
    def save(self) -> None:
        """Copy the state into host memory (no host check). Collective only with a sharded optimizer."""
        optimizer = None
        if self.optimizer is not None:
            if isinstance(self.optimizer, ShardedState):  # ZeRO-1: every rank keeps the whole state
                optimizer = _host_copy(self.optimizer.consolidate(to=None), self._old("optimizer"))
            else:
                optimizer = _host_copy(self.optimizer.state_dict(), self._old("optimizer"))
        self._saved(
            {
                "size": runtime.size(),
                "model": _host_copy(self.model.state_dict(), self._old("model")) if self.model is not None else None,
                "optimizer": optimizer,
                "objects": {name: copy.deepcopy(obj.state_dict()) for name, obj in self.objects.items()},
                "values": copy.deepcopy(self.values),
            }
        )

    def _old(self, key):
        return None if self._commit is None else self._commit.get(key)

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
        """Go back to the last commit, in this process (no collective): model, optimizer, objects, values."""
        if self._commit is None:
            return
        self._load_local(self._commit)

    def _load_local(self, commit, resized=False):
        if self.model is not None and commit["model"] is not None:
            self.model.load_state_dict(commit["model"])
        if self.optimizer is not None and commit["optimizer"] is not None:
            _zero_grads(self.optimizer)
            if not isinstance(self.optimizer, ShardedState):
                self.optimizer.load_state_dict(commit["optimizer"])
            elif resized:  # sharded: only once its slices fit this size (sync() after resize())
                self.optimizer.load_unsharded(commit["optimizer"])
        for name, obj in self.objects.items():
            if name in commit["objects"]:
                obj.load_state_dict(copy.deepcopy(commit["objects"][name]))
        for name, value in copy.deepcopy(commit["values"]).items():
            setattr(self, name, value)

    def sync(self) -> None:
        """Make every rank hold the newest commit of any rank (a new worker too), at this world size. Collective.

        Calls ``on_resize(size)`` first; when no rank has a commit yet (the job's start), ``on_start()``
        (or a broadcast of rank 0's model and optimizer) and a first commit instead.
        """
        comm = runtime.communicator()
        if self.on_resize is not None:
            self.on_resize(comm.size)
        if isinstance(self.optimizer, ShardedState):  # ZeRO-1: slices for this size; the state arrives below
            self.optimizer.resize()
        ids = comm.allgather_object(self._commit["id"] if self._commit is not None else -1, name="hvdkit.elastic.ids")
        newest = max(ids)
        if newest < 0:  # the job's start: nothing committed anywhere
            if self.on_start is not None:
                self.on_start()
            else:
                share_state(comm, self.model, self.optimizer, root=0)
            self.save()
            return
        root = ids.index(newest)
        header = None
        if comm.rank == root:
            self._load_local(self._commit, resized=True)  # restore() did it after a failure; a host update not
            header = {k: self._commit[k] for k in ("objects", "values", "size")}
        header = share_state(comm, self.model, self.optimizer, extra=header, root=root)
        if comm.rank != root:
            self._commit = None  # a stale commit of its own, or none: the root's is now the state
            for name, obj in self.objects.items():
                if name in header["objects"]:
                    obj.load_state_dict(copy.deepcopy(header["objects"][name]))
            for name, value in copy.deepcopy(header["values"]).items():
                setattr(self, name, value)
        if self.optimizer is not None:
            _zero_grads(self.optimizer)
        step = int(getattr(self, "step", 0) or 0)
        _reseed(self.seed, step, comm.rank)
        self._commit_id = newest
        self.save()  # every rank (a new worker too) holds the state it goes on from


def _zero_grads(optimizer):
    """Drop gradients and the counts of a step cut short (its allreduces were finished by engine fix 76; a
    sharded optimizer's rounds are forgotten by its ``resize()``)."""
    if isinstance(optimizer, ShardedState):
        torch.optim.Optimizer.zero_grad(optimizer, set_to_none=True)
        return
    optimizer.zero_grad(set_to_none=True)
    set_accumulation(optimizer, optimizer.backward_passes_per_step)  # the pass counts start anew


def set_accumulation(optimizer: torch.optim.Optimizer, backward_passes_per_step: int) -> None:
    """Make ``hk.DistributedOptimizer``'s result average every ``backward_passes_per_step`` passes from now on
    (the accumulation of a new world size after a recovery). No collective."""
    optimizer.backward_passes_per_step = backward_passes_per_step
    delay = getattr(optimizer, "_allreduce_delay", None)
    if isinstance(delay, dict):
        for p in delay:
            delay[p] = backward_passes_per_step


def _reseed(seed, step, rank):
    value = reseed_rng(seed, step, rank)
    torch.manual_seed(value)
    return value


def _host_copy(tree, old=None):
    """``tree`` (a state dict) with every tensor copied to host memory; reuses ``old``'s tensors of the same
    shape and dtype (the previous commit's), so a commit allocates nothing in the steady state."""
    if isinstance(tree, torch.Tensor):
        t = tree.detach()
        if isinstance(old, torch.Tensor) and old.shape == t.shape and old.dtype == t.dtype and not old.is_cuda:
            old.copy_(t)
            return old
        return t.to("cpu", copy=True)
    if isinstance(tree, dict):
        out = type(tree)() if not hasattr(tree, "_metadata") else copy.copy(tree)
        for k, v in tree.items():
            out[k] = _host_copy(v, old.get(k) if isinstance(old, dict) else None)
        if hasattr(tree, "_metadata"):
            out._metadata = copy.deepcopy(tree._metadata)
        return out
    if isinstance(tree, (list, tuple)) and not hasattr(tree, "_fields"):
        olds = old if isinstance(old, (list, tuple)) and len(old) == len(tree) else [None] * len(tree)
        return type(tree)(_host_copy(v, o) for v, o in zip(tree, olds, strict=True))
    return copy.deepcopy(tree)


def run(func: Callable[..., Any]) -> Callable[..., Any]:
    """Decorate the training function ``func(state, ...)`` so that it survives lost workers in-process.

    Under ``hvdkit run --recovery in-process``: the state is synced (the start: ``on_start``; later the
    newest commit) and ``func`` called; when a collective fails because a worker was lost, every
    rank left goes back to its last commit, Horovod re-forms the ring without the lost worker, and
    ``func`` is called again from there (at the smaller size: ``on_resize``); when the driver has a
    new worker, the ranks stop at their next commit and ``func`` goes on with it. Rank 0 logs each
    recovery with its time. Outside in-process recovery, ``func`` runs once after the start's sync.
    Collective: every rank calls the decorated function with its ``State``.
    """

    @functools.wraps(func)
    def wrapper(state: State, *args: Any, **kwargs: Any) -> Any:
        if not isinstance(state, State):
            raise ConfigError(
                f"@hk.elastic.run needs an hk.elastic.State as the first argument (got {type(state).__name__})"
            )
        runtime.init()
        if not in_process():
            _inside[0] += 1
            try:
                state.sync()
                return func(state, *args, **kwargs)
            finally:
                _inside[0] -= 1
        return _run_in_process(func, state, args, kwargs)

    return wrapper


def _run_in_process(func, state, args, kwargs):
    from horovod.common.elastic import notification_manager
    from horovod.common.exceptions import HorovodInternalError, HostsUpdatedInterrupt

    hvd = horovod_torch()
    notification_manager.init()
    notification_manager.register_listener(state)
    _inside[0] += 1
    try:
        return recover_in_process(
            lambda: func(state, *args, **kwargs),
            state,
            joins=HostsUpdatedInterrupt,
            is_lost=lambda error: isinstance(error, HorovodInternalError),
            begin=lambda cause, error: _begin_recovery(state, cause, error),
            reset=lambda: _form_again(hvd, state, HorovodInternalError),
            recovered=lambda: _say_recovered(state),
        )
    finally:
        _inside[0] -= 1
        notification_manager.remove_listener(state)


def _form_again(hvd, state, lost):
    """The ring formed again (``_reset``), rank-prefixed logging and threads for this rank and size, the state
    told."""
    _reset(functools.partial(_restart, hvd), lost, state)
    runtime.init()
    state.on_reset()


def _reset(restart: Callable[[], Any], lost: type[BaseException], state: State) -> None:
    """``hvdkit.core.recovery.reset_with_retries``; a job whose ring cannot be formed again resumes from its
    newest checkpoint at its next start."""
    then = "start it again (it resumes from its newest checkpoint), and check why workers keep failing"
    reset_with_retries(restart, lost, state, then=then)


def _restart(hvd):
    hvd.shutdown()
    hvd.init()


def _begin_recovery(state, cause, error):
    hvd = horovod_torch()
    begin_recovery(state, cause, hvd.size(), hvd.rank(), None if error is None else str(error))


def _say_recovered(state):
    say_recovered(state, runtime.size(), runtime.is_rank0())


class CommitSchedule(recovery.CommitSchedule):
    """Which steps of torch training commit: ``hvdkit.core.recovery.CommitSchedule`` over this process's Horovod
    communicator. ``every``: a number of steps, or ``"auto"`` (measured over the first ``AUTO_PROBE`` steps, then
    commits cost at most ``AUTO_BUDGET`` of the time). Collective: as the core's."""

    def __init__(self, every: int | str) -> None:
        super().__init__(every, runtime.communicator)
