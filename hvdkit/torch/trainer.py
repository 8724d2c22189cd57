"""``Trainer``: one ``fit()`` that ties sharding, averaging, exact metrics, checkpoints and resume together.

It assembles hvdkit's parts (``DistributedOptimizer``, ``train_loader``, ``eval_loader``,
``MetricTracker``, ``Checkpointer``, ``PreemptionGuard``, ``ScaledLRScheduler``, ``autocast``/
``amp_step``, ``progress``, ``Tracker``, ``StragglerMonitor``) into the loop every Horovod user
otherwise writes by hand, with the same arithmetic as that loop (examples/torch_digits.py).
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import os
import time
from collections.abc import Callable, Iterable, Mapping
from types import SimpleNamespace
from typing import Any

import torch
from torch.utils.data import Dataset, IterableDataset

from ..core.data import plan_batches
from ..core.errors import ConfigError
from ..core.log import get_logger
from ..core.metrics import MetricTracker
from ..core.options import check_positive_int
from ..core.recovery import RankWatch
from ..core.tune_channel import report_from
from . import elastic, runtime
from .checkpoint import Checkpointer
from .data import eval_loader, train_loader
from .monitoring import StragglerMonitor, Tracker, progress
from .optim import DistributedOptimizer, ScaledLRScheduler, amp_step, autocast
from .state import broadcast_state
from .trainer_options import TrainerOptions
from .trainer_parts import History, LearningState, call_callbacks

__all__ = ["Trainer", "History"]

_log = get_logger("trainer")
_DTYPE = {"bf16": "bfloat16", "fp16": "float16"}


class Trainer:
    """Data-parallel training of a torch model on every rank of the job: ``history = trainer.fit(train, val, epochs)``.

        trainer = hk.Trainer(model, torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
                             torch.nn.functional.cross_entropy, batch_size=32,
                             metrics={"accuracy": lambda out, y: (out.argmax(1) == y).float().mean()},
                             checkpoint_dir="checkpoints/run1")
        history = trainer.fit(train_set, val_set, epochs=12)   # resumes from checkpoint_dir by itself
        history.history["val_accuracy"]                           # one value per epoch, every rank

    The Trainer calls ``hk.init()``, moves ``model`` to ``hk.device()`` and wraps ``optimizer`` (a
    plain torch optimizer over the model's parameters) in ``hk.DistributedOptimizer`` with
    ``compression``, ``max_grad_norm`` (clipping after averaging), ``shard_optimizer_state`` (ZeRO
    stage 1: each rank keeps the optimizer state of a 1/size slice of the parameters; checkpoints stay
    the unsharded optimizer's, gathered to rank 0 in chunks) and the accumulation of the batch
    plan. Options (keyword only; the names of the rest of hvdkit's API):

    - ``loss_fn(output, target)``: the batch's mean loss; ``metrics``: ``{name: fn(output, target)}``,
      each a batch mean, averaged over all samples of all ranks exactly (``loss``, ``<name>``,
      ``val_loss``, ``val_<name>`` in the history).
    - ``batch_size`` (per rank), ``global_batch_size`` (samples per step over all ranks, kept at any
      world size by accumulation; see ``hk.train_loader``), ``backward_passes_per_step`` (without a
      global batch), ``eval_batch_size`` (default ``batch_size``), ``shuffle``, ``drop_last``,
      ``seed`` (sample order and re-seeding at another world size), ``num_workers``.
    - ``checkpoint_dir`` (None: no checkpoints), ``checkpoint_every`` (``"epoch"``, or a number of
      optimizer steps: also mid-epoch, with the epoch's global sample offset), ``keep``,
      ``async_save`` (True: training waits only while rank 0 copies the state to host memory, a
      thread writes it; ``fit`` waits for the last write before it returns, also when stopped),
      ``writer_priority`` (``"auto"``, ``"normal"``, ``"low"`` or ``"idle"``: that thread's priority, see
      ``hk.Checkpointer``).
    - ``precision``: ``"fp32"``, ``"bf16"`` (forward pass under ``hk.autocast``) or ``"fp16"``
      (autocast plus a ``torch.amp.GradScaler`` stepped by ``hk.amp_step``).
    - ``lr_rule`` (``"linear"``, ``"sqrt"``, ``"none"``) and ``warmup_steps``: an ``hk.ScaledLRScheduler``
      stepped after every optimizer step (not with ``global_batch_size``: the batch does not change
      with the ranks); ``scheduler``: a function ``opt -> torch LR scheduler`` built on the trainer's
      optimizer, stepped per ``scheduler_interval`` (``"epoch"`` or ``"step"``).
    - ``callbacks``: objects with any of ``on_train_begin(trainer)``, ``on_train_batch_end(step, logs)``
      (after every optimizer step; ``logs``: this rank's ``loss`` over the step's samples and the
      ``lr`` it used), ``on_epoch_end(epoch, logs)``, ``on_train_end(history)``, called on every rank.
      Setting ``trainer.stop_training = True`` on any rank ends ``fit`` on every rank: in
      ``on_train_batch_end`` after that step (checkpointed mid-epoch, as on SIGTERM:
      ``history.stopped``), in ``on_epoch_end`` after that epoch. ``trainer.epoch`` is the epoch
      being trained (0-based).
    - ``tracking``: None, a log directory (TensorBoard, via ``hk.Tracker``) or an ``hk.Tracker``;
      ``progress``: rank 0's progress bar (``hk.progress``); ``straggler_threshold``: a report per
      epoch of which rank's steps hold the job back (``hk.StragglerMonitor``).
    - ``commit_every``: under ``hvdkit run --recovery in-process`` (``hvdkit.torch.elastic``), the optimizer
      steps between commits of the training state to host memory, where the ranks left after a lost worker
      go on from (no restart, no disk read; at each epoch end and checkpoint too). ``"auto"`` (default)
      measures a step and a commit over the first 5 steps and commits as often as costs at most 2 % of the
      time. Needs ``train_data`` as a Dataset. With ``shard_optimizer_state`` every commit gathers the whole
      optimizer state to every rank's host memory.
    - Inside a trial of ``hvdkit tune``, rank 0 reports every epoch's metrics (the history's) to it
      (``hvdkit.tune.report``), so a pruned trial stops through the preemption path.

    Bad options raise ConfigError on every rank before any collective; ``trainer.options`` holds the checked
    ones (a frozen ``hvdkit.torch.trainer_options.TrainerOptions``, one field per parameter).
    Collective: every rank constructs it (``compression="auto"`` times the gradients now) and calls ``fit``.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        loss_fn: Callable[[Any, Any], torch.Tensor],
        *,
        metrics: Mapping[str, Callable[[Any, Any], Any]] | None = None,
        batch_size: int,
        global_batch_size: int | None = None,
        backward_passes_per_step: int = 1,
        eval_batch_size: int | None = None,
        shuffle: bool = True,
        drop_last: bool = False,
        num_workers: int = 0,
        checkpoint_dir: str | os.PathLike[str] | None = None,
        checkpoint_every: int | str = "epoch",
        keep: int = 3,
        async_save: bool = True,
        compression: str = "auto",
        max_grad_norm: float | None = None,
        shard_optimizer_state: bool = False,
        precision: str = "fp32",
        lr_rule: str = "none",
        warmup_steps: int = 0,
        scheduler: Callable[[torch.optim.Optimizer], Any] | None = None,
        scheduler_interval: str = "epoch",
        callbacks: Iterable[Any] = (),
        tracking: str | os.PathLike[str] | Tracker | None = None,
        progress: bool = True,
        straggler_threshold: float | None = None,
        seed: int = 0,
        commit_every: int | str = "auto",
        writer_priority: str = "auto",
    ) -> None:
        # The options, checked on every rank alike before any collective (ConfigError naming the fix)
        o = TrainerOptions(
            model=model,
            optimizer=optimizer,
            loss_fn=loss_fn,
            metrics=metrics,
            batch_size=batch_size,
            global_batch_size=global_batch_size,
            backward_passes_per_step=backward_passes_per_step,
            eval_batch_size=eval_batch_size,
            shuffle=shuffle,
            drop_last=drop_last,
            num_workers=num_workers,
            checkpoint_dir=checkpoint_dir,
            checkpoint_every=checkpoint_every,
            keep=keep,
            async_save=async_save,
            compression=compression,
            max_grad_norm=max_grad_norm,
            shard_optimizer_state=shard_optimizer_state,
            precision=precision,
            lr_rule=lr_rule,
            warmup_steps=warmup_steps,
            scheduler=scheduler,
            scheduler_interval=scheduler_interval,
            callbacks=callbacks,
            tracking=tracking,
            progress=progress,
            straggler_threshold=straggler_threshold,
            seed=seed,
            commit_every=commit_every,
            writer_priority=writer_priority,
        )
        self.options = o
        self.model, self.loss_fn, self.metrics = o.model, o.loss_fn, o.metrics
        self.callbacks = o.callbacks
        self.stop_training = False
        self.epoch = 0
        self._lr_of_last_step = float("nan")
        comm = runtime.communicator()  # starts Horovod once
        self.comm = comm
        # The accumulation of the batch plan: a bad global batch is a ConfigError on every rank, here.
        self.accumulation = plan_batches(
            o.batch_size, comm.size, o.global_batch_size, o.backward_passes_per_step
        ).accumulation
        self.device = runtime.device()
        o.model.to(self.device)
        self.optimizer = DistributedOptimizer(
            o.optimizer,
            model=o.model,
            compression=o.compression,
            backward_passes_per_step=self.accumulation,
            max_grad_norm=o.max_grad_norm,
            shard_optimizer_state=o.shard_optimizer_state,
        )
        use_rule = o.lr_rule != "none" or o.warmup_steps
        rule = ScaledLRScheduler(self.optimizer, o.lr_rule, o.warmup_steps) if use_rule else None
        self.lr_rule = rule
        self.scheduler = o.scheduler(self.optimizer) if o.scheduler is not None else None
        self.scaler = torch.amp.GradScaler(self.device.type) if o.precision == "fp16" else None
        state = LearningState({"lr_rule": rule, "scheduler": self.scheduler, "scaler": self.scaler})
        self._learning = state
        self._elastic = None  # the in-process recovery state during fit (hvdkit run --recovery in-process)
        self._built_size = comm.size
        self.checkpointer = (
            Checkpointer(
                o.checkpoint_dir,
                o.model,
                self.optimizer,
                state,
                keep=o.keep,
                seed=o.seed,
                async_save=o.async_save,
                writer_priority=o.writer_priority,
            )
            if o.checkpoint_dir is not None
            else None
        )
        self.monitor = (
            StragglerMonitor(o.straggler_threshold, name="trainer", optimizer=self.optimizer)
            if o.straggler_threshold is not None
            else None
        )

    # ------------------------------------------------------------------ fit
    def fit(self, train_data: Any, val_data: Any = None, epochs: int = 1) -> History:
        """Train to ``epochs`` epochs in all (a resumed run continues to it); the ``History`` of this call.

        ``train_data``: a map-style ``Dataset`` of ``(input, target, ...)`` samples (hvdkit shards it:
        every sample once per epoch in a global order from ``(seed, epoch)``, the same at any world
        size), or an iterable of this rank's ``(input, target, ...)`` batches that you shard yourself
        (the same number of batches on every rank; ``set_epoch(epoch)`` is called on it, or on its
        ``sampler``, when it has one; a mid-epoch resume skips the batches done, at the same world
        size only). ``val_data``: a ``Dataset`` (every sample once over all ranks, no padding) or an
        iterable of this rank's batches. With ``checkpoint_dir``, the newest checkpoint there is
        restored first; SIGTERM (or an elastic stop) checkpoints the step and ends the call with
        ``history.stopped``.
        Collective: every rank calls it with the same arguments.
        """
        check_positive_int("epochs", epochs, "the total number of epochs, e.g. epochs=10")
        self._loader = self._train_loader(train_data)
        val_loader = self._val_loader(val_data)
        if elastic.in_process():
            return self._fit_in_process(train_data, val_data, epochs)
        run = self._start()
        return self._epochs(run, train_data, val_loader, epochs)

    def _start(self):
        """The position to train from: the newest checkpoint's, or a fresh start (rank 0's state on every rank)."""
        resumed = self.checkpointer.restore() if self.checkpointer is not None else None
        if resumed is None:
            broadcast_state(self.model, self.optimizer)
            start_epoch, step, position = 0, 0, {}
        else:  # position: where a stopped epoch stopped (empty after a whole epoch)
            start_epoch, step, position = resumed.epoch, resumed.step, dict(resumed.extra or {})
            if "batches_done" in position and resumed.world_size != self.comm.size:
                raise ConfigError(
                    f"the checkpoint stopped mid-epoch at {resumed.world_size} ranks over batches this script "
                    f"shards itself; resume it at {resumed.world_size} ranks, or pass a Dataset (sharded by global "
                    "sample offset at any world size)"
                )
        history = History(resumed_from_epoch=start_epoch, step=step)
        return SimpleNamespace(epoch=start_epoch, step=step, position=position, history=history)

    def _fit_in_process(self, train_data, val_data, epochs):
        """``fit`` under ``hvdkit run --recovery in-process``: the epochs under ``hk.elastic.run``, in memory."""
        if self._loader is None:
            raise ConfigError(
                "in-process recovery re-shards the data at each new world size, by global sample offset: pass "
                f"train_data as a map-style torch Dataset (got {type(train_data).__name__}), or run with "
                "--recovery restart"
            )
        objects = {"learning": self._learning}
        for i, cb in enumerate(self.callbacks):  # callbacks with a state go back to the commit too
            if callable(getattr(cb, "state_dict", None)) and callable(getattr(cb, "load_state_dict", None)):
                objects[f"callback{i}"] = cb
        state = elastic.State(
            self.model,
            self.optimizer,
            objects=objects,
            seed=self.options.seed,
            on_resize=lambda size: self._resize(train_data, size),
            **vars(SimpleNamespace(epoch=0, step=0, position={}, history=History())),
        )
        self._ranks = RankWatch()  # this process's rank at the last sync, and whether it started the job
        state.on_start = lambda: self._start_job(state)
        self._elastic = state
        self._schedule = elastic.CommitSchedule(self.options.commit_every)
        try:
            # the loaders as rebuilt for the size of each (re)start: read when the loop is entered
            return elastic.run(lambda st: self._epochs(st, train_data, self._val_loader(val_data), epochs))(state)
        finally:
            self._elastic = None

    def _start_job(self, state):
        """``State.on_start`` (the job's start, not a worker that joins): the position to train from. Collective."""
        self._ranks.started()
        vars(state).update(vars(self._start()))

    def _resize(self, train_data, size):
        """After a recovery at another world size: the accumulation, data shards and rate rule of ``size`` ranks
        (the validation shards are made anew at every entry of the loop). Called at every sync: a background
        checkpoint write this process had in flight is settled here, without a collective (a joining worker
        has none to settle)."""
        if self.checkpointer is not None:
            self.checkpointer.store.settle_locally()
        if size == self._built_size:
            return
        o = self.options
        self.accumulation = plan_batches(
            o.batch_size, size, o.global_batch_size, o.backward_passes_per_step
        ).accumulation
        elastic.set_accumulation(self.optimizer, self.accumulation)
        self._loader = self._train_loader(train_data)
        if self.lr_rule is not None:  # the rule for this size; the committed state loaded next re-applies it
            self.lr_rule = ScaledLRScheduler(self.optimizer, o.lr_rule, o.warmup_steps)
            self._learning.parts["lr_rule"] = self.lr_rule
        self._built_size = size

    def _epochs(self, run, train_data, val_data, epochs):
        """Train from ``run``'s position (epoch, step, position, history) to ``epochs``; the history. Collective."""
        loader, val_loader = self._loader, val_data  # val_data: the loader (or this rank's batches)
        if self._elastic is not None:
            self._schedule.restart()
            self._say_rank0(run.step)
        start_epoch, step, position, history = run.epoch, run.step, run.position, run.history
        guard = runtime.PreemptionGuard()
        self.stop_training = False  # a stop asked in an earlier fit() call does not carry over
        tracker = self._tracker()
        call_callbacks(self.callbacks, "on_train_begin", self)
        try:
            for epoch in range(start_epoch, epochs):
                self.epoch = epoch
                t0 = time.perf_counter()
                step, stopped, totals = self._train_epoch(loader, train_data, epoch, epochs, step, position, guard, run)
                history.step = step
                if stopped:
                    history.stopped = True
                    break
                position = {}
                if self.scheduler is not None and self.options.scheduler_interval == "epoch":
                    self.scheduler.step()
                logs = {**totals, **(self._evaluate(val_loader) if val_loader is not None else {})}
                logs["lr"] = self._lr_of_last_step
                if self.checkpointer is not None:
                    self.checkpointer.save(step, epoch + 1)
                if self.monitor is not None:
                    self.monitor.epoch_end(epoch)
                seconds = time.perf_counter() - t0
                logs["epoch_time"] = self.comm.allreduce_sum([seconds], name="hvdkit.trainer.time")[0] / self.comm.size
                self._log_epoch(epoch, epochs, logs, tracker)
                history.append(epoch, logs)
                report_from(self.comm.rank, epoch, logs)  # to `hvdkit tune`'s trial, when inside one (rank 0 only)
                call_callbacks(self.callbacks, "on_epoch_end", epoch, dict(logs))
                stop = self._asked_to_stop()
                if self._elastic is not None:  # the epoch's end, in memory: a lost worker does not redo it
                    run.epoch, run.step, run.position = epoch + 1, step, {}
                    self._elastic.commit()
                if stop:
                    break
        finally:
            guard.close()
            if tracker is not None and tracker is not self.options.tracking:
                tracker.close()
        if self.checkpointer is not None:  # the last background write (a stop's too); its failure on every rank
            self.checkpointer.wait()
        call_callbacks(self.callbacks, "on_train_end", history)
        return history

    def evaluate(self, data: Any) -> dict[str, float]:
        """``{"val_loss": ..., "val_<metric>": ...}`` of the model now over ``data`` (as ``fit``'s ``val_data``).

        Every sample of a ``Dataset`` counts once over all ranks (no padding); an iterable is this
        rank's batches. The result is the same on every rank. Collective: every rank calls it.
        """
        loader = self._val_loader(data)
        if loader is None:
            raise ConfigError("evaluate() needs data: a map-style torch Dataset or an iterable of batches (got None)")
        return self._evaluate(loader)

    def _train_loader(self, data):
        o = self.options
        if isinstance(data, Dataset) and not isinstance(data, IterableDataset) and hasattr(data, "__len__"):
            loader = train_loader(
                data,
                o.batch_size,
                shuffle=o.shuffle,
                seed=o.seed,
                drop_last=o.drop_last,
                global_batch_size=o.global_batch_size,
                backward_passes_per_step=o.backward_passes_per_step,
                num_workers=o.num_workers,
            )
            plan = loader.plan
            if o.drop_last and len(data) < plan.global_batch_size:  # the same on every rank: no collective
                other = " or global_batch_size" if plan.fixed else " or fewer ranks" if plan.size > 1 else ""
                raise ConfigError(
                    f"train_data has {len(data)} samples, fewer than one global batch of {plan.global_batch_size} "
                    f"({plan.describe()}), and drop_last=True drops that incomplete batch: fit() would train 0 "
                    "steps. Pass drop_last=False (the smaller last step trains too), a smaller batch_size"
                    f"{other}, or more samples"
                )
            return loader
        if not isinstance(data, Iterable):
            raise ConfigError(
                f"train_data must be a map-style torch Dataset or an iterable of batches (got {type(data).__name__})"
            )
        if o.global_batch_size is not None or o.checkpoint_every is not None:
            raise ConfigError(
                "global_batch_size and checkpoint_every=<steps> need train_data as a map-style Dataset (hvdkit "
                f"shards it by global sample offset); got {type(data).__name__}: pass the Dataset, not a loader"
            )
        return None

    def _val_loader(self, data):
        if data is None:
            return None
        if isinstance(data, Dataset) and not isinstance(data, IterableDataset) and hasattr(data, "__len__"):
            size = self.options.eval_batch_size or self.options.batch_size
            return eval_loader(data, size, num_workers=self.options.num_workers)
        if not isinstance(data, Iterable):
            raise ConfigError(
                "val_data must be a map-style torch Dataset, an iterable of batches or None "
                f"(got {type(data).__name__})"
            )
        return data

    def _batches(self, loader, data, epoch, epochs, position):
        """This rank's micro-batches of ``epoch`` from where a stopped run stopped; the batches skipped."""
        if loader is not None:
            loader.sampler.set_epoch(epoch, start=position.get("samples_done", 0))
            source, skip = loader, 0
        else:
            target = data if hasattr(data, "set_epoch") else getattr(data, "sampler", None)
            if callable(getattr(target, "set_epoch", None)):
                target.set_epoch(epoch)
            skip = position.get("batches_done", 0)
            source = itertools.islice(data, skip, None) if skip else data
        if not self.options.progress:
            return source, skip
        total = len(loader) if loader is not None else (len(data) - skip if hasattr(data, "__len__") else None)
        if total is None:
            return source, skip
        return progress(source, desc=f"epoch {epoch + 1}/{epochs}", total=total), skip

    def _train_epoch(self, loader, data, epoch, epochs, step, position, guard, run):
        """One epoch (or its rest); ``(step, stopped, averaged train metrics)``. Collective."""
        self.model.train()
        batches, skipped = self._batches(loader, data, epoch, epochs, position)
        tracker = MetricTracker(["loss", *self.metrics])
        if self.comm.is_rank0:  # the job-wide totals of the stopped part of the epoch, counted once
            for name, (total, count) in position.get("train_totals", {}).items():
                tracker.update_sum(name, total, count)
        acc, every, steps_done = self.accumulation, self.options.checkpoint_every, 0
        last = loader.sampler.steps if loader is not None else None
        step_loss = [0.0, 0]  # this rank's loss sum and sample count in the current step
        for micro, batch in enumerate(batches, 1):
            if self.monitor is not None and micro % acc == 1 % acc:
                self.monitor.step_begin()
            self._forward_backward(batch, tracker, step_loss)
            if micro % acc:
                continue
            self._optimizer_step()
            step += 1
            steps_done += 1
            if self.monitor is not None:
                self.monitor.step_end()
            logs = {"loss": step_loss[0] / max(step_loss[1], 1), "lr": self._lr_of_last_step}
            step_loss[:] = [0.0, 0]
            call_callbacks(self.callbacks, "on_train_batch_end", step, logs)
            # Every rank stops after this same step: a signal on any rank, or a callback's stop_training
            stop = guard.should_stop(step=step, also=self.stop_training)
            saving = stop or (every is not None and step % every == 0 and steps_done != last)
            if saving:
                self._save_position(step, epoch, loader, steps_done, skipped + micro, tracker)
            if self._elastic is not None and steps_done != last and (self._schedule.due() or saving):
                self._schedule.commit(functools.partial(self._commit, run, step, epoch, loader, steps_done, tracker))
            if stop:
                if self.comm.is_rank0:
                    why = "" if guard.stopped else " (stop_training)"
                    _log.info("stopped in epoch %d after step %d%s%s", epoch + 1, step, why, self._saved_note())
                return step, True, {}
        return step, False, self._average(tracker, "hvdkit.trainer.train")

    def _say_rank0(self, step):
        """After a sync: the process that became rank 0 (rank 0 was lost, or a worker that joined was given rank 0)
        logs it, and that it writes the checkpoints from ``step`` on (the folder's lock is taken at its first
        save: ``CheckpointStore``)."""
        how = self._ranks.after_sync(self.comm.rank)
        if how is not None:
            writes = f": it writes the checkpoints from step {step}" if self.checkpointer is not None else ""
            _log.info("rank 0 is now process %d (%s)%s", os.getpid(), how, writes)

    def _saved_note(self):
        return ": checkpoint saved" if self.checkpointer is not None else " (no checkpoint_dir: nothing saved)"

    def _forward_backward(self, batch, tracker, step_loss):
        x, y = self._to_device(batch)
        with self._autocast():
            out = self.model(x)
            loss = self.loss_fn(out, y)
        scaled = loss / self.accumulation  # the mean over the step's micro-batches
        (self.scaler.scale(scaled) if self.scaler is not None else scaled).backward()
        count = len(y)
        value = loss.item()
        tracker.update("loss", value, count)
        step_loss[0] += value * count
        step_loss[1] += count
        if self.metrics:
            with torch.no_grad():
                for name, fn in self.metrics.items():
                    tracker.update(name, float(fn(out.detach(), y)), count)

    def _optimizer_step(self):
        if self.scaler is not None:
            amp_step(self.optimizer, self.scaler)
        else:
            self.optimizer.step()
        self.optimizer.zero_grad()
        self._lr_of_last_step = float(self.optimizer.param_groups[0]["lr"])
        if self.lr_rule is not None:
            self.lr_rule.step()
        if self.scheduler is not None and self.options.scheduler_interval == "step":
            self.scheduler.step()

    def _save_position(self, step, epoch, loader, steps_done, micro_done, tracker):
        """A mid-epoch checkpoint: the epoch's global sample offset (or batches done) and its metric totals."""
        if self.checkpointer is None:
            return
        where = {"samples_done": loader.position(steps_done)} if loader is not None else {"batches_done": micro_done}
        self.checkpointer.save(step, epoch, extra={**where, "train_totals": self._totals(tracker)})

    def _totals(self, tracker):
        """The job-wide ``[sum, count]`` of every metric of the epoch so far. Collective."""
        local = tracker.local()
        names = sorted(local)
        flat = self.comm.allreduce_sum([v for n in names for v in local[n]], name="hvdkit.trainer.totals")
        return {n: [float(flat[2 * i]), int(flat[2 * i + 1])] for i, n in enumerate(names)}

    def _commit(self, run, step, epoch, loader, steps_done, tracker):
        """Commit the position after this step in memory (in-process recovery): it goes on from here. Collective."""
        run.step = step
        run.position = {"samples_done": loader.position(steps_done), "train_totals": self._totals(tracker)}
        run.epoch = epoch
        self._elastic.commit()

    def _evaluate(self, loader):
        """``val_loss`` and ``val_<metric>`` over every validation sample of every rank. Collective."""
        self.model.eval()
        tracker = MetricTracker(["val_loss", *(f"val_{n}" for n in self.metrics)])
        with torch.no_grad():
            for batch in loader:
                x, y = self._to_device(batch)
                with self._autocast():
                    out = self.model(x)
                    loss = self.loss_fn(out, y)
                tracker.update("val_loss", loss.item(), len(y))
                for name, fn in self.metrics.items():
                    tracker.update(f"val_{name}", float(fn(out, y)), len(y))
        return self._average(tracker, "hvdkit.trainer.val")

    def _average(self, tracker, name):
        means = tracker.compute(self.comm, name=name)
        return {n: means[n] for n in tracker.local()}  # in the tracker's order: loss first

    def _to_device(self, batch):
        if not isinstance(batch, (tuple, list)) or len(batch) < 2:
            raise ConfigError(
                f"a batch must be (input, target, ...) (got {type(batch).__name__}); "
                "make the dataset return (input, target) samples"
            )
        return batch[0].to(self.device), batch[1].to(self.device)

    def _autocast(self):
        precision = self.options.precision
        if precision == "fp32":
            return contextlib.nullcontext()
        return autocast(dtype=_DTYPE[precision], device_type=self.device.type)

    def _tracker(self):
        tracking = self.options.tracking
        if tracking is None or isinstance(tracking, Tracker):
            return tracking
        return Tracker(tracking)  # a log directory: TensorBoard, closed at the end of fit

    def _log_epoch(self, epoch, epochs, logs, tracker):
        if tracker is not None:
            tracker.log_metrics(logs, step=epoch)
        if self.comm.is_rank0:
            shown = " ".join(
                f"{k} {v:.4g}" if k == "lr" else f"{k} {v:.4f}" for k, v in logs.items() if k != "epoch_time"
            )
            _log.info("epoch %d/%d: %s (%.2f s)", epoch + 1, epochs, shown, logs["epoch_time"])

    def _asked_to_stop(self):
        """True on every rank when a callback set ``stop_training`` on any rank. Collective."""
        flag = 1.0 if self.stop_training else 0.0
        return self.comm.allreduce_sum([flag], name="hvdkit.trainer.stop")[0] > 0
