"""In-process recovery for Keras ``model.fit`` (``hvdkit run --recovery in-process``): the model, its optimizer
and the position in the data committed in host memory, restored in the processes that are left after a worker
is lost, without a restart or a disk read.

One call in place of ``model.fit`` (the data in memory, as ``hk.epoch_dataset`` takes it)::

    model.compile(optimizer=hk.DistributedOptimizer(keras.optimizers.SGD(0.05, momentum=0.9)), loss=..., metrics=[...])
    history = hk.elastic.fit(model, (x, y), batch_size=32, global_batch_size=64, epochs=10, seed=0,
                             callbacks=[hk.MetricAverageCallback()], commit_every=10)

Under ``--recovery in-process`` a lost worker sends the others back to their last commit; Horovod re-forms
the ring at the smaller size and ``fit`` goes on from the committed epoch and global sample offset, with the
batch plan of the new size (a fixed global batch by Keras's gradient accumulation), so every sample of an
epoch is trained on once and the steps are those of an uninterrupted run. A new worker joins at the next
commit and gets the state there. Outside it, the same call is one plain ``fit``. The parts, for a ``fit`` of
your own: ``State``, ``run``, ``set_accumulation`` (torch's ``hk.elastic`` has the same names).
"""

from __future__ import annotations

import copy
import functools
import queue
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from ..core.data import plan_batches, position_after, rank_seed, step_bounds
from ..core.errors import CollectiveError, ConfigError
from ..core.log import get_logger
from ..core.options import check_positive_int
from ..tensorflow import runtime
from ..tensorflow._engine import horovod_tf
from ..tensorflow.data import epoch_dataset
from ..tensorflow.variables import broadcast_variables
from ._recovery_scope import _inside, check_inside_run, in_process, inside_run
from .optimizer import _AveragingMixin
from .zero import is_sharded

__all__ = ["State", "check_inside_run", "fit", "in_process", "inside_run", "run", "set_accumulation"]

_log = get_logger("elastic")
_ACCUMULATOR = "_gradient_accumulator"  # Keras 3 names its accumulators <variable>_gradient_accumulator
RESET_ATTEMPTS = 5  # tries in a row to form the ring again, each failed by a worker lost meanwhile


def _optimizer(model):
    """``model``'s optimizer, checked (``_checked``)."""
    return _checked(getattr(model, "optimizer", None))


def _checked(opt):
    """``opt`` if it is hvdkit's, unsharded, without a loss-scale wrapper; else ConfigError."""
    if not isinstance(opt, _AveragingMixin):
        raise ConfigError(
            "hk.elastic needs a model compiled with hk.DistributedOptimizer "
            f"(got {type(opt).__name__ if opt is not None else 'no optimizer'}); compile it first"
        )
    if is_sharded(opt):
        raise ConfigError(
            "hk.elastic does not support shard_optimizer_state=True for Keras yet; pass shard_optimizer_state=False"
        )
    return opt


def accumulation(optimizer: keras.optimizers.Optimizer) -> int:
    """Keras's gradient accumulation steps of ``optimizer`` (1 when it does not accumulate)."""
    return int(optimizer.gradient_accumulation_steps or 1)


def _accumulators(optimizer):
    return [v for v in optimizer.variables if v.name.endswith(_ACCUMULATOR)]


def _state_variables(optimizer):
    """The optimizer's variables that hold state (its gradient accumulators are zero between steps)."""
    return [v for v in optimizer.variables if not v.name.endswith(_ACCUMULATOR)]


def _variable(optimizer, name):
    for v in optimizer.variables:
        if v.name == name:
            return v
    return None


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
    opt.gradient_accumulation_steps = steps if steps > 1 else None
    if opt.built:
        counter = _variable(opt, "iteration")  # Keras's raw batch counter: iterations x accumulation
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


class State:
    """What Keras training needs to go back to after a lost worker, committed in host memory.

    ``model`` is compiled with ``hk.DistributedOptimizer`` (not sharded). A commit holds the model's weights,
    the optimizer's variables (its step count, learning rate and slots; not Keras's gradient accumulators,
    zero between steps), the accumulation it was made at, and the keyword ``values`` (attributes:
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
        for name in values:
            if name.startswith("_") or hasattr(type(self), name):
                raise ConfigError(f"State value {name!r} would hide an attribute of hk.elastic.State; rename it")
        self.model = model
        self.optimizer = _optimizer(model)
        self.seed = seed
        self.on_resize = on_resize
        self.on_start = on_start
        self._names = tuple(values)
        for name, value in values.items():
            setattr(self, name, value)
        self._commit: dict[str, Any] | None = None
        self._commit_id = 0
        self._since_commit = 0
        self._messages: queue.Queue = queue.Queue()
        self._last_update = 0
        self.recoveries: list[dict[str, Any]] = []  # one entry per recovery: cause, sizes, step, seconds

    @property
    def values(self) -> dict[str, Any]:
        """The keyword values, as now (not as committed)."""
        return {name: getattr(self, name) for name in self._names}

    def _build(self):
        if not self.optimizer.built:  # a worker that joins has not stepped yet: the same variables as the others
            self.optimizer.build(self.model.trainable_variables)

    # ------------------------------------------------------------------ commits
    def commit(self) -> None:
        """Copy the state into host memory, then let a waiting worker join (it may raise Horovod's
        ``HostsUpdatedInterrupt``, which ``run`` handles). Collective: every rank calls it alike."""
        self.save()
        self.check_host_updates()

    def commit_every(self, steps: int) -> bool:
        """Count a step; every ``steps``-th call commits (``commit()``). True when it committed. Collective."""
        self._since_commit += 1
        if self._since_commit < steps:
            return False
        self.commit()
        return True

    def save(self) -> None:
        """Copy the state into host memory (no host check, no collective)."""
        self._build()
        old = self._commit or {}
        self._commit_id += 1
        self._commit = {
            "id": self._commit_id,
            "size": runtime.size(),
            "step": int(self.optimizer.iterations.numpy()),  # optimizer steps, at any accumulation
            "model": _host_copy(list(self.model.weights), old.get("model")),
            "optimizer": _host_copy(_state_variables(self.optimizer), old.get("optimizer")),
            "values": copy.deepcopy(self.values),
        }
        self._since_commit = 0

    def on_hosts_updated(self, timestamp: float, update_res: Any) -> None:
        """Horovod's worker notification service: the driver has workers to add or remove."""
        self._messages.put((timestamp, update_res))

    def check_host_updates(self) -> None:
        """Raise ``HostsUpdatedInterrupt`` on every rank alike when the driver said hosts changed. Collective.

        The newest notice any rank has heard decides, against the newest any rank has acted on (a worker
        that has just joined acted on none, and must not take the notice it joined by for a new one)."""
        from horovod.common.exceptions import HostsUpdatedInterrupt
        from horovod.runner.elastic.worker import HostUpdateResult

        heard, kinds = self._last_update, 0
        while not self._messages.empty():
            timestamp, result = self._messages.get()
            if timestamp > heard:
                heard, kinds = timestamp, kinds | int(result)
        everyone = runtime.communicator().allgather_object(
            (self._last_update, heard, kinds), name="hvdkit.keras.elastic.hosts"
        )
        acted = max(a for a, _, _ in everyone)
        newest = max(t for _, t, _ in everyone)
        self._last_update = max(acted, newest)
        if newest > acted:
            merged = 0
            for _, t, k in everyone:
                if t > acted:
                    merged |= k
            raise HostsUpdatedInterrupt(merged == int(HostUpdateResult.removed))

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
        for v, a in zip(_state_variables(opt), commit["optimizer"], strict=True):
            if v.name == "iteration":  # the raw batch counter at this accumulation
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
        variables = list(self.model.weights) + _state_variables(self.optimizer)
        ids = comm.allgather_object(
            self._commit["id"] if self._commit is not None else -1, name="hvdkit.keras.elastic.ids"
        )
        newest = max(ids)
        if newest < 0:  # the job's start: nothing committed anywhere
            if self.on_start is not None:
                self.on_start()
            else:
                broadcast_variables(variables, 0)
            self.save()
            return
        root = ids.index(newest)
        header = None
        if comm.rank == root:
            self._load(self._commit)  # at this size: its accumulation, its rate
            header = {"values": self._commit["values"]}
        header = comm.broadcast_object(header, name="hvdkit.keras.elastic.values", root=root)
        broadcast_variables(variables, root)
        if comm.rank != root:
            for name, value in copy.deepcopy(header["values"]).items():
                setattr(self, name, value)
            for v in _accumulators(self.optimizer):
                v.assign(tf.zeros_like(v))
        step = int(getattr(self, "step", 0) or 0)
        keras.utils.set_random_seed(rank_seed(self.seed, step, comm.rank) & 0xFFFFFFFF)
        self._commit_id = newest
        self.save()  # every rank (a new worker too) holds the state it goes on from

    def on_reset(self) -> None:
        """After Horovod re-formed the ring (``run`` calls it): forget host notices of the old ring, and trace
        the train step again (its collectives and accumulation belong to the world size it was traced at)."""
        self._messages = queue.Queue()
        if getattr(self.model, "train_function", None) is not None:
            self.model.make_train_function(force=True)


def _lost_worker(error):
    """True for a failed Horovod collective: Horovod's own error, or TensorFlow's for a Horovod op."""
    from horovod.common.exceptions import HorovodInternalError

    if isinstance(error, HorovodInternalError):
        return True
    return isinstance(error, tf.errors.OpError) and "Horovod" in str(error.message)


def run(func: Callable[..., Any]) -> Callable[..., Any]:
    """Decorate the training function ``func(state, ...)`` so that it survives lost workers in-process.

    Under ``hvdkit run --recovery in-process``: the state is synced (the start: ``on_start``; later the newest
    commit) and ``func`` called; when a collective fails because a worker was lost (in ``fit``'s train step or
    in a commit), every rank left goes back to its last commit, Horovod re-forms the ring without the lost
    worker, and ``func`` is called again from there (at the smaller size: ``on_resize``); when the driver
    has a new worker, the ranks stop at their next commit and ``func`` goes on with it. Rank 0 logs each
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
        _inside[0] += 1
        try:
            if not in_process():
                state.sync()
                return func(state, *args, **kwargs)
            return _run_in_process(func, state, args, kwargs)
        finally:
            _inside[0] -= 1

    return wrapper


def _run_in_process(func, state, args, kwargs):
    from horovod.common.elastic import notification_manager
    from horovod.common.exceptions import HorovodInternalError, HostsUpdatedInterrupt

    notification_manager.init()
    notification_manager.register_listener(state)
    # No hold_stop_signals() here, unlike torch's: fit has no PreemptionGuard of its own to hand a held SIGTERM
    # to, so a held one would be ignored until the end; SIGTERM ends the worker (a guard callback of the user's
    # installs its own handler, as outside recovery).
    try:
        while True:
            try:
                state.sync()
                _say_recovered(state)
                return func(state, *args, **kwargs)
            except HostsUpdatedInterrupt:
                _begin_recovery(state, "workers join", None)
            except Exception as e:
                if not _lost_worker(e):
                    raise
                _begin_recovery(state, "a worker was lost", e)
                state.restore()
            _reset(state, HorovodInternalError)
            runtime.init()  # rank-prefixed logging for this rank and size
            state.on_reset()
    finally:
        notification_manager.remove_listener(state)


def _reset(state, lost):
    """Shut Horovod down and start it again (the driver's next rendezvous forms the new ring); a worker lost
    while it forms fails ``hvd.init()`` (engine fix 17): try again, at most ``RESET_ATTEMPTS`` times."""
    hvd = horovod_tf()
    for attempt in range(1, RESET_ATTEMPTS + 1):
        try:
            hvd.shutdown()
            hvd.init()
            return
        except lost as e:
            if attempt == RESET_ATTEMPTS:
                raise CollectiveError(
                    f"in-process recovery gave up: the ring could not be formed again {attempt} times in a row, "
                    f"each time because a worker was lost while it formed ({e}); start the job again, and check "
                    "why workers keep failing"
                ) from e
            if state.recoveries:
                state.recoveries[-1]["failed_resets"] = attempt
            _log.warning(
                "a worker was lost while the ring formed again (%s); trying again (%d of %d)",
                e,
                attempt,
                RESET_ATTEMPTS,
            )


def _begin_recovery(state, cause, error):
    hvd = horovod_tf()
    step = getattr(state, "step", None)
    state.recoveries.append({"cause": cause, "from_size": hvd.size(), "t0": time.monotonic(), "step": step})
    if error is not None:
        _log.warning("rank %d: %s (%s); going back to the last commit", hvd.rank(), cause, str(error)[:300])


def _say_recovered(state):
    if not state.recoveries or "seconds" in state.recoveries[-1]:
        return
    last = state.recoveries[-1]
    last["seconds"] = time.monotonic() - last["t0"]
    last["to_size"] = runtime.size()
    last["resumed_step"] = getattr(state, "step", None)
    if runtime.is_rank0():
        failed = last.get("failed_resets")
        _log.info(
            "%s: %d -> %d ranks, going on from step %s (committed in memory) after %.2f s",
            last["cause"] + (f" ({failed} failed reset(s): a worker lost while the ring formed)" if failed else ""),
            last["from_size"],
            last["to_size"],
            last["resumed_step"],
            last["seconds"],
        )


# ---------------------------------------------------------------------- hk.elastic.fit
class _Progress(keras.callbacks.Callback):
    """In one ``model.fit`` of ``fit``: counts optimizer steps, records epoch, step and sample offset in the
    state, commits every ``every`` steps and at every epoch end, and tells ``on_step`` what each step trained."""

    def __init__(self, state, plan, bounds, full_bounds, start, every, batches, on_step):
        super().__init__()
        self.state, self.plan, self.bounds, self.full_bounds, self.start = state, plan, bounds, full_bounds, start
        self.every, self.batches, self.on_step = every, batches, on_step
        self.epoch, self.steps, self.micro, self.pending = 0, 0, 0, []

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch, self.steps, self.micro, self.pending = epoch, 0, 0, []

    def on_train_batch_end(self, batch, logs=None):
        self.pending += self.batches.popleft()
        self.micro += 1
        if self.micro % self.plan.accumulation:
            return
        self.steps += 1
        step = int(self.model.optimizer.iterations.numpy())
        if self.on_step is not None:
            self.on_step(self.epoch, step, self.pending)
        self.pending = []
        state = self.state
        state.step, state.samples_done = step, position_after(self.bounds, self.steps, self.start)
        if step % self.every == 0 and self.steps < len(self.bounds):  # an epoch's end commits below
            state.commit()

    def on_epoch_end(self, epoch, logs=None):
        state = self.state
        # committed with the epoch (a joining worker gets it too): a fit that a recovery cuts short returns no History
        state.history[epoch] = {k: _plain(v) for k, v in (logs or {}).items()}
        state.epoch, state.step, state.samples_done = epoch + 1, int(self.model.optimizer.iterations.numpy()), 0
        state.commit()  # the epoch's end: a lost worker does not redo it
        self.start, self.bounds = 0, self.full_bounds  # the next epoch starts at its beginning


class _Fit:
    """The training function ``fit`` runs under ``run``: from the committed epoch and sample offset, at this size."""

    def __init__(self, model, data, batch_size, epochs, options, fit_kwargs):
        self.model, self.data, self.batch_size, self.epochs = model, data, batch_size, epochs
        self.o, self.fit_kwargs = options, fit_kwargs
        self.n = int(tf.nest.flatten(tf.nest.map_structure(np.asarray, data))[0].shape[0])
        self.plan = None

    def resize(self, size):
        o = self.o
        self.plan = plan_batches(self.batch_size, size, o["global_batch_size"], o["backward_passes_per_step"])
        if runtime.is_rank0():
            _log.info("%s", self.plan.describe())
        set_accumulation(self.model.optimizer, self.plan.accumulation)

    def __call__(self, state):
        epoch, start = state.epoch, state.samples_done
        if start and epoch < self.epochs:
            self._fit(state, epoch, epoch + 1, start)
            epoch += 1
        if epoch < self.epochs:
            self._fit(state, epoch, self.epochs, 0)
        return _history(state.history)

    def _fit(self, state, first, last, start):
        o, plan = self.o, self.plan
        batches = deque()  # this fit's batches, announced by its input pipeline ahead of training
        ds, steps = epoch_dataset(
            self.data, self.batch_size, last, first, seed=o["seed"], shuffle=o["shuffle"],
            global_batch_size=o["global_batch_size"], backward_passes_per_step=plan.accumulation,
            drop_last=o["drop_last"], on_batch=lambda e, s, idx: batches.append(idx), start=start,
        )  # fmt: skip
        bounds = [step_bounds(self.n, s, plan.global_batch_size, plan.slots, o["drop_last"]) for s in (start, 0)]
        progress = _Progress(state, plan, *bounds, start, o["commit_every"], batches, o["on_step"])
        val = o["validation_data"]
        self.model.fit(
            ds,
            steps_per_epoch=steps,
            epochs=last,
            initial_epoch=first,
            validation_data=val() if callable(val) else val,
            callbacks=[*o["callbacks"], progress],
            verbose=o["verbose"],
            **self.fit_kwargs,
        )


def _plain(value):
    """A logged metric as a Python number (picklable, committed by value); anything else as it is."""
    return float(value) if isinstance(value, (int, float, np.generic)) or tf.is_tensor(value) else value


def _history(epochs):
    """A Keras History of ``{epoch: logs}``."""
    h = keras.callbacks.History()
    h.epoch = sorted(epochs)
    h.history = {}
    for e in h.epoch:
        for k, v in epochs[e].items():
            h.history.setdefault(k, []).append(v)
    return h


def fit(
    model: keras.Model,
    data: Any,
    *,
    batch_size: int,
    epochs: int,
    global_batch_size: int | None = None,
    backward_passes_per_step: int | None = None,
    seed: int = 0,
    shuffle: bool = True,
    drop_last: bool = False,
    commit_every: int = 10,
    callbacks: list[keras.callbacks.Callback] | tuple = (),
    validation_data: Any = None,
    on_step: Callable[[int, int, list[int]], Any] | None = None,
    verbose: int = 0,
    **fit_kwargs: Any,
) -> keras.callbacks.History:
    """``model.fit`` over in-memory ``data`` (arrays, or a tuple/dict of them, as ``hk.epoch_dataset`` takes)
    that survives lost workers in-process under ``hvdkit run --recovery in-process``; elsewhere one plain
    ``fit`` (rank 0's initial state on every rank first).

    ``model`` is compiled with ``hk.DistributedOptimizer`` (unsharded). The data of each world size comes
    from ``hk.epoch_dataset`` (the order of epoch e from ``(seed, e)``, the batches by global sample offset),
    the batch plan from ``hk.batch_plan(batch_size, global_batch_size, backward_passes_per_step)``: with
    ``global_batch_size`` every optimizer step trains on the same samples at any size, by Keras's gradient
    accumulation (``set_accumulation``). A commit (``State``: weights, optimizer variables, epoch, step,
    the epoch's sample offset) is made every ``commit_every`` optimizer steps (when the step count is a
    multiple of it) and at every epoch end; after a recovery ``fit`` goes on from it: the rest of the
    committed epoch first (its logged metrics cover the batches since the recovery), then the epochs left.
    ``validation_data``: as ``model.fit``'s, or a function of no arguments that returns it, called at each
    (re)start (shard it there with ``hk.shard``: the shards of the world size then). ``on_step(epoch, step,
    indices)`` is called after every optimizer step with the sample indices this rank trained on in it.
    ``callbacks`` are ``fit``'s (leave out ``BroadcastInitialStateCallback``: the sync does it). The
    History has one entry per epoch, the last run of it. Other keywords go to ``model.fit``.
    Collective: every rank calls it with the same arguments.
    """
    check_positive_int("epochs", epochs, "the total number of epochs, e.g. epochs=10")
    check_positive_int("commit_every", commit_every, "the optimizer steps between two commits, e.g. 10")
    opt = _optimizer(model)
    options = {
        "global_batch_size": global_batch_size,
        "backward_passes_per_step": accumulation(opt) if backward_passes_per_step is None else backward_passes_per_step,
        "seed": seed,
        "shuffle": shuffle,
        "drop_last": drop_last,
        "commit_every": commit_every,
        "callbacks": list(callbacks),
        "validation_data": validation_data,
        "on_step": on_step,
        "verbose": verbose,
    }
    train = _Fit(model, data, batch_size, epochs, options, fit_kwargs)
    state = State(model, seed=seed, on_resize=train.resize, epoch=0, step=0, samples_done=0, history={})
    history = run(train)(state)
    history.recoveries = state.recoveries
    return history
