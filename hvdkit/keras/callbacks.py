"""Keras 3 callbacks: initial-state broadcast, exact metric averaging, LR warmup, rank-0 checkpoints."""

from __future__ import annotations

import os
from typing import Any

import keras
import numpy as np

from ..core.checkpoint.store import Resumed
from ..core.data import rank_seed
from ..core.errors import ConfigError
from ..core.log import get_logger
from ..core.lr import check_rule, lr_scale
from ..core.metrics import sum_states
from ..core.options import check_int_at_least, check_number_above, check_positive_int
from ..tensorflow.checkpoint import Checkpointer
from ..tensorflow.runtime import communicator
from ..tensorflow.variables import broadcast_variables
from .zero import is_sharded

__all__ = [
    "BroadcastInitialStateCallback",
    "CheckpointCallback",
    "LearningRateWarmupCallback",
    "MetricAverageCallback",
    "average_model_metrics",
]

_log = get_logger("keras")


def _built_optimizer(model):
    opt = model.optimizer
    if opt is not None and not opt.built:
        opt.build(model.trainable_variables)
    return opt


class BroadcastInitialStateCallback(keras.callbacks.Callback):
    """At the start of ``fit``, copy rank 0's weights and optimizer variables to every rank.

    A sharded optimizer (``shard_optimizer_state=True``) sends only its variables that are not per
    slice (iterations, learning rate): each rank's slots belong to its own slice.

    Collective: every rank's ``fit`` has it.
    """

    def __init__(self, root_rank: int = 0) -> None:
        super().__init__()
        self.root_rank = root_rank

    def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
        opt = _built_optimizer(self.model)
        if opt is None:
            opt_vars = []
        elif is_sharded(opt):  # its slots hold this rank's slice: the same initial values everywhere
            opt_vars = opt.broadcastable_variables()
        else:
            opt_vars = list(opt.variables)
        broadcast_variables(list(self.model.weights) + opt_vars, self.root_rank)


def average_model_metrics(model: keras.Model) -> dict[str, float]:
    """The model's current metrics over all ranks' samples (``{name: value}``), exactly.

    Keras metrics keep additive state (a Mean keeps total and count; Precision and AUC keep
    confusion counts). Summing that state over ranks and asking each metric for its result gives
    the metric over the union of every rank's samples, also when shards are uneven. The summed
    state is left in the metrics. Use it after ``model.evaluate(...)``; ``MetricAverageCallback`` uses it
    during ``fit``. Collective: every rank calls it.
    """
    pairs = [(f"{i:04d}/{j:04d}", v) for i, m in enumerate(model.metrics) for j, v in enumerate(m.variables)]
    states = {key: np.ravel(np.asarray(v.numpy(), dtype=np.float64)) for key, v in pairs}
    summed = sum_states(states, communicator(), name="hvdkit.keras.metrics")
    for key, v in pairs:
        v.assign(np.reshape(np.asarray(summed[key]), tuple(v.shape)).astype(v.dtype))
    return {k: float(v) for k, v in model.get_metrics_result().items()}


class MetricAverageCallback(keras.callbacks.Callback):
    """Replace every rank's metrics in ``fit``'s logs by the metrics over all ranks' samples.

    Exact, also with uneven shards (see ``average_model_metrics``); Horovod's
    MetricAverageCallback averages per-rank results instead. Training metrics are read before
    ``fit`` evaluates the validation data, validation metrics right after, and both are written
    into the epoch's logs, so History, the progress bar and later callbacks see job-wide values.

    Collective: every rank's ``fit`` has it.
    """

    def __init__(self) -> None:
        super().__init__()
        self._train = self._val = None

    def on_epoch_begin(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        self._train = self._val = None

    def on_test_begin(self, logs: dict[str, Any] | None = None) -> None:
        # Inside fit, evaluate() calls this before it resets the metrics: they still hold training.
        self._train = average_model_metrics(self.model)

    def on_test_end(self, logs: dict[str, Any] | None = None) -> None:
        self._val = average_model_metrics(self.model)

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        train = self._train if self._train is not None else average_model_metrics(self.model)
        if logs is not None:
            logs.update(train)
            logs.update({f"val_{k}": v for k, v in (self._val or {}).items()})


class LearningRateWarmupCallback(keras.callbacks.Callback):
    """Raise the learning rate linearly from ``initial_lr`` to ``initial_lr * scale`` over ``warmup_epochs``.

    The usual large-batch recipe (Goyal et al.): N ranks see N times the samples per step, so the
    rate is scaled by N, gradually to keep the first steps stable. ``rule`` picks the scale
    (``hvdkit.core.lr``): ``"linear"`` (default, N), ``"sqrt"`` (sqrt(N), often used with Adam) or
    ``"none"``. Updated every batch; after the warmup the rate stays at ``initial_lr * scale``.
    Pass ``initial_lr`` explicitly (the optimizer's rate changes during warmup and is restored from
    checkpoints). It needs a constant rate; for a schedule, or a warmup counted in steps, use
    ``hvdkit.keras.ScaledLRSchedule``.
    """

    def __init__(self, initial_lr: float, warmup_epochs: int = 5, verbose: int = 0, rule: str = "linear") -> None:
        super().__init__()
        self.initial_lr = check_number_above("initial_lr", initial_lr, what="a positive number")
        self.warmup_epochs = check_int_at_least("warmup_epochs", warmup_epochs, 0)
        self.rule = check_rule(rule)
        self.verbose = verbose
        self._epoch = 0

    def _set(self, lr):
        try:
            self.model.optimizer.learning_rate = lr
        except TypeError as e:
            raise ConfigError(f"LearningRateWarmupCallback needs a constant learning rate, not a schedule ({e})") from e

    def target(self, epoch: int, batch: int, steps: int) -> float:
        """The learning rate at ``batch`` of ``epoch`` (``steps`` batches per epoch)."""
        scale = lr_scale(communicator().size, self.rule)
        if epoch >= self.warmup_epochs:
            return self.initial_lr * scale
        progress = (epoch + batch / max(1, steps)) / self.warmup_epochs
        return self.initial_lr * (1 + (scale - 1) * progress)

    def on_epoch_begin(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        self._epoch = epoch
        self._set(self.target(epoch, 0, 1))

    def on_train_batch_begin(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        if self._epoch < self.warmup_epochs:
            self._set(self.target(self._epoch, batch, self.params.get("steps") or 1))

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        if self.verbose and communicator().is_rank0:
            _log.info("epoch %d: learning rate %.6g", epoch + 1, float(self.model.optimizer.learning_rate))


class CheckpointCallback(keras.callbacks.Callback):
    """Rank-0 checkpoints at the end of every ``every`` epochs (atomic, the newest ``keep`` kept).

        ckpt = hk.CheckpointCallback("checkpoints/run1", model)      # after model.compile
        resumed = ckpt.restore()                                      # a Resumed, or None
        model.fit(..., initial_epoch=ckpt.initial_epoch, callbacks=[..., ckpt])

    ``restore()`` loads the newest good checkpoint on every rank (weights, optimizer variables) and
    returns what it brought back, a ``Resumed`` (``epoch``, ``step``, ``world_size``, ...), or None on
    a fresh start, as ``Checkpointer.restore()`` of ``hvdkit.torch`` and ``hvdkit.tensorflow`` does;
    ``initial_epoch`` is then the epoch to continue from (0 on a fresh start). ``fit`` resumes at
    epoch boundaries, at any world size: with a fixed global batch (``hk.batch_plan``) the optimizer step count
    carries over across accumulation changes. A checkpoint written by another number of ranks is
    resumed with this run's learning rate (what the script set for this world size, e.g.
    ``scaled_lr``; a ``ScaledLRSchedule`` follows the size anyway) and the RNGs re-seeded
    (``keras.utils.set_random_seed``) from ``(seed, step, rank)``; both logged on rank 0. In the callbacks of
    ``hk.elastic.fit`` it is restored and written by that ``fit`` (mid-epoch too, at a stop on SIGTERM): no
    ``restore()`` or ``initial_epoch`` there.
    Collective: every rank creates it, calls ``restore`` and has it in ``fit``.
    """

    def __init__(
        self,
        directory: str | os.PathLike[str],
        model: keras.Model | None = None,
        keep: int = 3,
        every: int = 1,
        seed: int = 0,
    ) -> None:
        super().__init__()
        check_positive_int("every", every)
        self.directory = directory
        self.keep = keep
        self.every = every
        self.seed = seed
        self._bound_model = model
        self._ckpt = None
        self.resumed = None

    def _checkpointer(self):
        model = self._bound_model or self.model
        if self._ckpt is None or self._ckpt.model is not model:
            self._ckpt = Checkpointer(self.directory, model, _built_optimizer(model), keep=self.keep, seed=self.seed)
        return self._ckpt

    @property
    def initial_epoch(self) -> int:
        """The epoch to pass to ``fit`` as ``initial_epoch``: the restored checkpoint's, or 0."""
        return self.resumed.epoch if self.resumed else 0

    def restore(self) -> Resumed | None:
        """Load the newest good checkpoint on every rank: its ``Resumed``, or None when there is none.

        Collective: every rank calls it.
        """
        ckpt = self._checkpointer()
        lr = _constant_lr(ckpt.optimizer)
        configured = None if lr is None else float(lr.numpy())
        self.resumed = ckpt.restore()
        comm = communicator()
        if self.resumed is not None and self.resumed.world_size != comm.size:
            saved = None if lr is None else float(lr.numpy())
            if lr is not None:
                lr.assign(configured)
            keras.utils.set_random_seed(rank_seed(self.seed, self.resumed.step, comm.rank) & 0xFFFFFFFF)
            if comm.is_rank0:
                rate = (
                    ""
                    if lr is None
                    else f"learning rate {configured:.6g} as configured for this size (saved: {saved:.6g}), "
                )
                _log.warning(
                    "checkpoint was written by %d ranks, this job has %d: resuming at epoch %d with %s"
                    "RNGs re-seeded from (seed %d, step %d, rank)",
                    self.resumed.world_size,
                    comm.size,
                    self.resumed.epoch,
                    rate,
                    self.seed,
                    self.resumed.step,
                )
        return self.resumed

    def save(self, epoch: int, extra: Any = None) -> str:
        """Write a checkpoint of the optimizer's step count now, ``epoch`` epochs completed (rank 0 writes):
        what ``on_epoch_end`` writes every ``every`` epochs, and what ``hk.elastic.fit`` writes when a stop
        signal ends it mid-epoch (``extra``: the epoch's sample offset and the History so far). ``extra`` takes
        what ``Checkpointer.save`` takes; ``restore()`` gives it back as ``resumed.extra``. The checkpoint's path.
        Collective: every rank calls it.
        """
        opt = self._checkpointer().optimizer
        return self._checkpointer().save(step=int(opt.iterations) if opt is not None else 0, epoch=epoch, extra=extra)

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        if (epoch + 1) % self.every == 0:
            self.save(epoch + 1)


def _constant_lr(optimizer):
    """The optimizer's learning-rate variable, or None (no optimizer, or a schedule: Keras makes no variable then)."""
    for v in optimizer.variables if optimizer is not None else []:
        if v.name == "learning_rate":
            return v
    return None
