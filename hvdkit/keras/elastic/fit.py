"""``hk.elastic.fit``: Keras ``model.fit`` over in-memory data that survives lost workers in-process."""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Callable
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from ...core.data import plan_batches, position_after, step_bounds
from ...core.log import get_logger
from ...core.options import check_positive_int
from ...core.recovery import CommitSchedule, RankWatch, check_commit_every
from ...tensorflow import runtime
from ...tensorflow.data import epoch_dataset
from . import metrics
from .loop import run
from .preempt import Preemption, checkpoint_callback, position
from .state import State, _optimizer, accumulation, set_accumulation

__all__ = ["fit"]

_log = get_logger("elastic")


class _Progress(keras.callbacks.Callback):
    """In one ``model.fit`` of ``fit``: counts optimizer steps, records epoch, step and sample offset in the
    state, commits at the steps ``schedule`` (a ``CommitSchedule``) says and at every epoch end (timed by it too),
    tells ``on_step`` what each step trained, and after every step asks the guard whether to stop (``preempt``:
    every rank stops after the same step, the checkpoint of that step written). A mid-epoch commit and checkpoint
    hold every rank's metric state (``metrics.gather`` over ``comm()``); a fit that starts mid-epoch (``start``)
    adds the committed one (``state.metrics``) into the metrics after its first batch, once Keras has reset them."""

    def __init__(self, state, plan, bounds, full_bounds, start, schedule, batches, on_step, preempt, comm):
        super().__init__()
        self.state, self.plan, self.bounds, self.full_bounds, self.start = state, plan, bounds, full_bounds, start
        self.schedule, self.batches, self.on_step, self.preempt = schedule, batches, on_step, preempt
        self.comm = comm
        self.epoch, self.steps, self.micro, self.pending = 0, 0, 0, []
        self.stopped = False
        self.base = state.metrics if start else None  # the epoch's metric state before ``start``

    def _metrics(self):
        """Every rank's metric state now (``metrics.gather``). Collective."""
        return metrics.gather(self.model, self.comm())

    def _commit(self):
        self.state.metrics = self._metrics()  # before the commit: a join it may raise takes it along
        self.state.commit()

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch, self.steps, self.micro, self.pending = epoch, 0, 0, []

    def on_train_batch_end(self, batch, logs=None):
        if self.base is not None:  # the first batch of the rest of an epoch: Keras reset the metrics and built them
            comm = self.comm()
            metrics.restore(self.model, self.base, comm.size, comm.rank)
            self.base = None
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
        ends_epoch = self.steps >= len(self.bounds)
        due = self.schedule.due()  # every step counts, and is timed while "auto" measures
        if self.preempt.should_stop(step):
            # no commit: a host update it may raise would start the training again
            self.model.stop_training = self.stopped = True
            if not ends_epoch:  # else on_epoch_end saves the epoch's end
                self.preempt.save(self.epoch, state.samples_done, state.history, self._metrics())
                self.preempt.say_stopped(self.epoch, step)
        elif due and not ends_epoch:  # an epoch's end commits below
            self.schedule.commit(self._commit)

    def on_epoch_end(self, epoch, logs=None):
        if self.stopped and self.steps < len(self.bounds):
            return  # Keras ends the epoch a stop broke out of; it is not done (the checkpoint says where it stopped)
        state = self.state
        # committed with the epoch (a joining worker gets it too): a fit that a recovery cuts short returns no History
        state.history[epoch] = {k: _plain(v) for k, v in (logs or {}).items()}
        state.epoch, state.step, state.samples_done = epoch + 1, int(self.model.optimizer.iterations.numpy()), 0
        state.metrics = None  # the next epoch starts from Keras's reset
        if self.stopped or self.preempt.due(epoch + 1):  # before the commit: a join it may raise skips what follows
            self.preempt.save(epoch + 1, 0, state.history)
        if self.stopped:
            self.preempt.say_stopped(epoch, state.step)
            return
        self.schedule.commit(state.commit)  # the epoch's end: a lost worker does not redo it
        self.start, self.bounds = 0, self.full_bounds  # the next epoch starts at its beginning


class _Fit:
    """The training function ``fit`` runs under ``run``: from the committed epoch and sample offset, at this size.
    ``stopped``: the last training ended on a stop signal."""

    def __init__(self, model, data, batch_size, epochs, options, fit_kwargs, preempt):
        self.model, self.data, self.batch_size, self.epochs = model, data, batch_size, epochs
        self.o, self.fit_kwargs, self.preempt = options, fit_kwargs, preempt
        self.n = int(tf.nest.flatten(tf.nest.map_structure(np.asarray, data))[0].shape[0])
        self.plan = None
        self.schedule = CommitSchedule(options["commit_every"], runtime.communicator)  # kept across recoveries
        self.stopped = False
        self.resumed_from_epoch = 0
        self.ranks = RankWatch()  # this process's rank at the last sync, and whether it started the job

    def start(self, state):
        """``State.on_start``: the newest checkpoint of the checkpoint callback, or rank 0's state. Collective."""
        self.ranks.started()
        resumed = self.preempt.restore()
        if resumed is None:
            state.broadcast_from(0)
        for name, value in position(resumed).items():
            setattr(state, name, value)
        self.resumed_from_epoch = state.epoch

    def resize(self, size):
        o = self.o
        self.plan = plan_batches(self.batch_size, size, o["global_batch_size"], o["backward_passes_per_step"])
        if runtime.is_rank0():
            _log.info("%s", self.plan.describe())
        set_accumulation(self.model.optimizer, self.plan.accumulation)

    def __call__(self, state):
        self.stopped = False
        self.schedule.restart()  # after every sync: count from the commit every rank holds now
        self._say_rank0(state)
        epoch, start, done = state.epoch, state.samples_done, False
        with self.preempt.guarded():
            if start and epoch < self.epochs:
                self.stopped = self._fit(state, epoch, epoch + 1, start)
                epoch += 1
                done = self.stopped or self.model.stop_training  # a stop signal, or a callback's (EarlyStopping)
            if epoch < self.epochs and not done:
                self.stopped = self._fit(state, epoch, self.epochs, 0)
        return _history(state.history)

    def _say_rank0(self, state):
        """After a sync: the process that became rank 0 (rank 0 was lost, or a worker that joined was given rank 0)
        logs that it writes the checkpoints now."""
        how = self.ranks.after_sync(runtime.rank())
        if how is not None:
            writes = f": it writes the checkpoints from step {state.step}" if self.preempt.ckpt is not None else ""
            _log.info("rank 0 is now process %d (%s)%s", os.getpid(), how, writes)

    def _fit(self, state, first, last, start):
        o, plan = self.o, self.plan
        batches = deque()  # this fit's batches, announced by its input pipeline ahead of training
        ds, steps = epoch_dataset(
            self.data, self.batch_size, last, first, seed=o["seed"], shuffle=o["shuffle"],
            global_batch_size=o["global_batch_size"], backward_passes_per_step=plan.accumulation,
            drop_last=o["drop_last"], on_batch=lambda e, s, idx: batches.append(idx), start=start,
        )  # fmt: skip
        bounds = [step_bounds(self.n, s, plan.global_batch_size, plan.slots, o["drop_last"]) for s in (start, 0)]
        progress = _Progress(
            state, plan, *bounds, start, self.schedule, batches, o["on_step"], self.preempt, runtime.communicator
        )
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
        return progress.stopped


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
    commit_every: int | str = "auto",
    callbacks: list[keras.callbacks.Callback] | tuple = (),
    validation_data: Any = None,
    on_step: Callable[[int, int, list[int]], Any] | None = None,
    verbose: int = 0,
    **fit_kwargs: Any,
) -> keras.callbacks.History:
    """``model.fit`` over in-memory ``data`` (arrays, or a tuple/dict of them, as ``hk.epoch_dataset`` takes)
    that survives lost workers in-process under ``hvdkit run --recovery in-process``; elsewhere one plain
    ``fit`` (rank 0's initial state on every rank first).

    ``model`` is compiled with ``hk.DistributedOptimizer``, sharded or not (``shard_optimizer_state=True``: each
    commit gathers the unsharded optimizer state to every rank's host memory, and a new size cuts the slices anew
    from it; ``State``). The data of each world size comes
    from ``hk.epoch_dataset`` (the order of epoch e from ``(seed, e)``, the batches by global sample offset),
    the batch plan from ``hk.batch_plan(batch_size, global_batch_size, backward_passes_per_step)``: with
    ``global_batch_size`` every optimizer step trains on the same samples at any size, by Keras's gradient
    accumulation (``set_accumulation``). A commit (``State``: weights, optimizer variables, epoch, step,
    the epoch's sample offset) is made at every epoch end and every ``commit_every`` optimizer steps, counted
    from the last sync (the start, a recovery, a join), as the torch Trainer counts them (before, ``fit``
    committed where the step count was a multiple of it: the same steps until the first recovery or resume);
    ``"auto"`` (the default, as the Trainer's) commits every step for the first 5 while it times a step and a
    commit, then as often as costs at most 2 % of the time (the ranks agree on the largest interval; rank 0
    logs it; ``hvdkit.core.recovery.CommitSchedule``). A mid-epoch commit also holds every rank's metric state
    (the variables of ``model.metrics``: the compiled loss tracker's and each metric's totals and counts; one small
    allreduce). After a recovery ``fit`` goes on from the newest commit: the rest of the committed epoch first,
    then the epochs left. The rest of an epoch adds the committed metric state into the metrics after its first
    batch (Keras resets them at the epoch's start), each rank its own at the committed size, the sum of the old
    ranks' states it stands for at another (``i % size == rank``), so the epoch's logged metrics (and
    ``MetricAverageCallback``'s job-wide ones) are those of the whole epoch: at the same size the same numbers as
    without the cut, at another within float32 rounding (for metrics whose state adds up over samples: totals
    and counts, confusion counts, as ``MetricAverageCallback`` assumes). A callback that sets
    ``model.stop_training`` in the rest of an epoch ends ``fit`` there. The process that becomes rank 0 when
    rank 0 is lost, or a worker that joins and is given rank 0, logs that it writes the checkpoints from then on.
    ``validation_data``: as ``model.fit``'s, or a function of no arguments that returns it, called at each
    (re)start (shard it there with ``hk.shard``: the shards of the world size then). ``on_step(epoch, step,
    indices)`` is called after every optimizer step with the sample indices this rank trained on in it.
    ``callbacks`` are ``fit``'s (leave out ``BroadcastInitialStateCallback``: the sync does it). The
    History has one entry per epoch, the last run of it. Other keywords go to ``model.fit``.
    Mixed precision: under ``mixed_float16`` ``model``'s optimizer is the loss-scale optimizer
    ``hk.DistributedOptimizer`` returns; its dynamic loss scale and count of good steps are committed and restored
    with the rest (a recovery goes back to the loss scale of the commit), and while it accumulates (a smaller size)
    it acts per optimizer step (``hvdkit.keras.loss_scale``), as at the full size.

    Stop and resume: after every optimizer step the ranks decide together (``PreemptionGuard``, one tiny
    allreduce) whether any got SIGTERM or SIGUSR1 (``hvdkit run`` passes a scheduler's SIGTERM on); then every
    rank stops after that same step, and the ``hk.CheckpointCallback`` in ``callbacks`` (at most one) writes
    the checkpoint of it: weights, optimizer variables, epoch, step, the epoch's sample offset and the History
    so far. ``fit`` returns with ``history.stopped`` True (exit 0: ``hvdkit run`` then exits 128 + 15). At its
    start, before the first commit, ``fit`` restores the newest good checkpoint of that callback, and goes on
    from its step (``history.resumed_from_epoch``: the epochs it had completed; ``history.step``: the optimizer
    steps done at the end). ``fit`` writes that callback itself (at the epoch ends it would, and at a stop),
    rather than ``model.fit``. Keras ends the epoch a stop broke out of (``on_epoch_end``, validation); the
    History leaves it out. A mid-epoch checkpoint also holds every rank's metric state, so a resumed epoch logs the
    metrics of the whole epoch, as after a recovery (a checkpoint without it, or of other metrics: those of the
    batches after the resume; rank 0 warns of the latter).
    Collective: every rank calls it with the same arguments.
    """
    check_positive_int("epochs", epochs, "the total number of epochs, e.g. epochs=10")
    check_commit_every(commit_every)
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
    ckpt, options["callbacks"] = checkpoint_callback(options["callbacks"])
    preempt = Preemption(ckpt, model)
    train = _Fit(model, data, batch_size, epochs, options, fit_kwargs, preempt)
    state = State(model, seed=seed, on_resize=train.resize, on_start=None, **position(None))
    state.on_start = lambda: train.start(state)
    history = run(train)(state)
    history.recoveries = state.recoveries
    history.stopped, history.resumed_from_epoch, history.step = train.stopped, train.resumed_from_epoch, state.step
    return history
