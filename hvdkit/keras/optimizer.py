"""A Keras 3 optimizer that really averages gradients over ranks; learning-rate scaling for it."""

from __future__ import annotations

import itertools
from typing import Any, Self

import keras
import tensorflow as tf

from ..core.errors import ConfigError
from ..core.lr import check_warmup_steps, lr_scale
from ..core.options import AUTO, check_compression, check_number_above, check_positive_int
from ..tensorflow import autocompress
from ..tensorflow.gradients import allreduce_gradients
from ..tensorflow.runtime import communicator
from ._recovery_scope import check_inside_run, in_process
from .allreduce_clock import AllreduceClock, allreduce_seconds
from .loss_scale import OuterScalingWatch, loss_scale_optimizer, uses_global_loss_scale
from .zero import ShardedMixin, check_shardable

__all__ = ["DistributedOptimizer", "ScaledLRSchedule", "allreduce_seconds", "is_distributed"]

_counter = itertools.count()
_classes = {}
_sharded_classes = {}


class _AveragingMixin(OuterScalingWatch):
    """Averages the gradients over ranks in ``apply``, the method every Keras 3 path goes through.

    ``model.fit`` (``apply_gradients`` -> ``apply``), custom loops, eager and ``tf.function``
    all reach ``apply``; Horovod's Keras optimizer hooks methods Keras 3 no longer calls, so its
    ranks silently train apart. Keras's own clipping (``clipnorm``, ``global_clipnorm``,
    ``clipvalue``), loss-scale unscaling and gradient accumulation run inside ``super().apply``,
    that is after the average. A Keras ``LossScaleOptimizer`` put around it later is refused
    (``hvdkit.keras.loss_scale``).
    """

    _hvdkit_compression = "none"
    _hvdkit_name = "hvdkit.optimizer.grads"
    _hvdkit_wait = None
    _hvdkit_groups = 1  # allreduce_gradients(groups=...): 1 grouped op; benchmarks.keras_overlap measures others

    @property
    def compression(self) -> str:
        """What the gradients are averaged in: ``"none"``, ``"fp16"`` (``"auto"`` until the first ``apply`` decides)."""
        return self._hvdkit_compression

    def _hvdkit_average(self, grads):
        return allreduce_gradients(grads, self._hvdkit_compression, self._hvdkit_name, self._hvdkit_groups)

    def _get_current_learning_rate(self):
        # Keras 3.15 evaluates a schedule at its raw batch counter (one count per ``apply``) when it
        # accumulates gradients: k times too fast at accumulation k, and a jump whenever k changes
        # with the world size (a fixed global batch). ``iterations`` counts optimizer steps.
        schedule = self._learning_rate
        if self.gradient_accumulation_steps and isinstance(schedule, keras.optimizers.schedules.LearningRateSchedule):
            return schedule(self.iterations)
        return super()._get_current_learning_rate()

    def build(self, variables):
        self._hvdkit_check_unwrapped()  # before any collective (a sharded build makes none either)
        if self.gradient_accumulation_steps or not in_process():
            return super().build(variables)
        # In-process recovery may have to accumulate at a smaller world size (hk.elastic.set_accumulation), and
        # Keras makes its gradient accumulators only when it accumulates at build time: make them now (zeros,
        # unused while it does not accumulate; a sharded optimizer's are the size of its slices).
        self.gradient_accumulation_steps = 2
        try:
            return super().build(variables)
        finally:
            self.gradient_accumulation_steps = None

    def apply(self, grads, trainable_variables=None):
        self._hvdkit_check_unwrapped()
        check_inside_run("the optimizer's apply()")  # under --recovery in-process: a fit it can recover
        if self._hvdkit_compression == AUTO:  # decided once, at the first apply (while tracing: eagerly)
            grads = list(grads)
            self._hvdkit_compression = autocompress.resolve(AUTO, grads)
        clock = self._hvdkit_wait  # StragglerMonitorCallback reads it (hvdkit.keras.allreduce_clock)
        grads = self._hvdkit_average(grads) if clock is None else clock.time(self._hvdkit_average, grads)
        return super().apply(grads, trainable_variables)


def _distributed_class(base):
    # Same name and module as the wrapped class: a saved model's optimizer config loads as the
    # plain optimizer (re-wrap it to train on many ranks again).
    if base not in _classes:
        _classes[base] = type(base.__name__, (_AveragingMixin, base), {"__module__": base.__module__})
    return _classes[base]


def _sharded_class(base):
    if base not in _sharded_classes:
        attrs = {"__module__": base.__module__, "_hvdkit_base": base}
        _sharded_classes[base] = type(base.__name__, (ShardedMixin, _AveragingMixin, base), attrs)
    return _sharded_classes[base]


def is_distributed(optimizer: object) -> bool:
    """True when ``optimizer`` came from ``DistributedOptimizer`` (a loss-scale optimizer it made included)."""
    return isinstance(optimizer, _AveragingMixin) or uses_global_loss_scale(optimizer)


def DistributedOptimizer(  # noqa: N802 - mirrors Horovod
    optimizer: keras.optimizers.Optimizer,
    compression: str = "none",
    backward_passes_per_step: int = 1,
    shard_optimizer_state: bool = False,
) -> keras.optimizers.Optimizer:
    """A copy of the Keras 3 ``optimizer`` (same class and config) that averages gradients over ranks.

    - ``compression``: ``"none"`` (exact fp32), ``"fp16"`` (half the bytes on the wire) or
      ``"auto"``: at the first ``apply`` time both on the variables' shapes and keep fp16 only if
      > 10 % faster (``hvdkit.tensorflow.autocompress``; HVDKIT_COMPRESSION overrides). The
      result's ``compression`` property says what it chose (``"auto"`` until the first ``apply``).
    - ``backward_passes_per_step``: apply the mean gradient of that many batches; implemented with
      Keras 3's own ``gradient_accumulation_steps``. Gradients are averaged over ranks at every
      batch (Keras accumulates inside ``apply``), so this saves memory and optimizer steps, not
      communication. A learning-rate schedule sees optimizer steps (``iterations``), as without
      accumulation (plain Keras 3.15 gives it the batch count).

    - ``shard_optimizer_state``: ZeRO stage 1 (``hvdkit.keras.zero``): each rank keeps the optimizer
      state (momentums, velocities, ...) of a contiguous 1/N slice of the flattened trainable
      variables only, so its optimizer variables hold about 1/N of the unsharded ones. ``apply``
      reduce-scatters the gradients (in fp16 with ``compression="fp16"``), the optimizer updates this
      rank's slice, and the slices are all-gathered back into the variables: every rank ends with
      bitwise the same weights, equal to the unsharded optimizer's to fp32 rounding. Elementwise
      optimizers only (``hvdkit.keras.zero.ELEMENTWISE_OPTIMIZERS``: SGD, Adam, AdamW, Adamax, Nadam,
      RMSprop, Adagrad, Adadelta, Lion, Ftrl); ``global_clipnorm`` and ``clipvalue`` act as
      unsharded (the global norm comes from the slices in one allreduce); ``clipnorm``, ``use_ema``,
      ``exclude_from_weight_decay`` and non-elementwise optimizers (Lamb, Adafactor, Muon, ...) raise
      ConfigError. Gradient accumulation (``backward_passes_per_step > 1``) accumulates this rank's
      slice of the averaged gradients (accumulators of the slice's size). A gradient that
      is None counts as 0. ``hk.CheckpointCallback`` (``hvdkit.tensorflow.Checkpointer``) saves the unsharded state,
      gathered to rank 0, which any world size restores, sharded or not; ``BroadcastInitialStateCallback``
      sends only the variables that are not per-slice. Build it (``fit``, ``apply`` or ``build``) with
      every variable it will update.

    Mixed precision (``keras.mixed_precision.set_global_policy("mixed_float16")`` before this call):
    the result is a ``keras.optimizers.LossScaleOptimizer`` (Keras's dynamic loss scaling, which
    ``model.compile`` then keeps as it is) around the distributed optimizer, whose check for inf/NaN
    gradients spans every rank (``hvdkit.keras.loss_scale``): a step that overflowed on any rank is
    skipped on all, and the loss scale stays the same everywhere. Given a ``LossScaleOptimizer``
    (any policy), it wraps the optimizer inside and keeps the scaling settings. A Keras
    ``LossScaleOptimizer`` put around the result raises ConfigError at the first ``build``/``apply``.

    Use it in ``model.compile(optimizer=...)`` or call ``apply``/``apply_gradients`` in a custom
    loop. Pass the plain optimizer: its state (if any) is not copied.

    Clipping: the optimizer's own ``global_clipnorm`` (or ``clipnorm``, ``clipvalue``) acts on the
    *averaged* gradient, because Keras clips inside ``apply`` after this wrapper has averaged:
    ``DistributedOptimizer(keras.optimizers.SGD(0.1, global_clipnorm=1.0))`` clips the gradient of
    the global batch, identically on every rank.
    Collective: every rank must apply gradients the same number of times.
    Env: HVDKIT_COMPRESSION (with ``compression="auto"``).
    """
    if not isinstance(optimizer, keras.optimizers.Optimizer):
        raise ConfigError(
            f"optimizer must be a Keras 3 optimizer (got {type(optimizer).__name__}); "
            "create one first, e.g. keras.optimizers.SGD(learning_rate=0.01)"
        )
    if is_distributed(optimizer):
        raise ConfigError("optimizer is already a DistributedOptimizer; wrap the plain optimizer once")
    loss_scale = None
    if isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
        loss_scale, optimizer = optimizer, optimizer.inner_optimizer
        if is_distributed(optimizer):
            raise ConfigError(
                "the LossScaleOptimizer holds a DistributedOptimizer; pass "
                "hk.DistributedOptimizer(keras.optimizers.LossScaleOptimizer(opt)) with the plain opt inside"
            )
    mixed = loss_scale is not None or keras.config.dtype_policy().name == "mixed_float16"
    compression = check_compression(compression, allow_auto=True)
    check_positive_int("backward_passes_per_step", backward_passes_per_step)
    if not isinstance(shard_optimizer_state, bool):
        raise ConfigError(f"shard_optimizer_state must be True or False (got {shard_optimizer_state!r})")
    if shard_optimizer_state:
        check_shardable(optimizer)
    config = optimizer.get_config()
    if backward_passes_per_step > 1:
        if config.get("gradient_accumulation_steps") not in (None, backward_passes_per_step):
            raise ConfigError(
                f"backward_passes_per_step={backward_passes_per_step} conflicts with the optimizer's "
                f"gradient_accumulation_steps={config['gradient_accumulation_steps']}; set one of them"
            )
        config["gradient_accumulation_steps"] = backward_passes_per_step
    make = _sharded_class if shard_optimizer_state else _distributed_class
    wrapped = make(type(optimizer)).from_config(config)
    wrapped._hvdkit_compression = compression
    # Wrapping happens in program order, so the n-th optimizer has the same name on every rank.
    wrapped._hvdkit_name = f"hvdkit.optimizer.{next(_counter)}.grads"
    wrapped._hvdkit_wait = AllreduceClock()
    if mixed:  # what model.compile would put around it, with a finite check that spans the ranks
        inner, wrapped = wrapped, loss_scale_optimizer(wrapped, loss_scale, sharded=shard_optimizer_state)
        _sealed(inner)  # after the wrapper has set its loss_scale_factor
    return _sealed(wrapped)


def _sealed(optimizer):
    optimizer._hvdkit_sealed = True  # from now on, a loss-scale wrapper around it is refused
    return optimizer


@keras.saving.register_keras_serializable(package="hvdkit")
class ScaledLRSchedule(keras.optimizers.schedules.LearningRateSchedule):
    """A learning-rate schedule: ``learning_rate`` scaled for the job's ranks, reached by linear warmup.

    ``lr(step) = learning_rate(step) * warmup_factor(step, warmup_steps, scale)`` with
    ``scale = lr_scale(size, rule)`` (``hvdkit.core.lr``): the rate starts at the single-process
    ``learning_rate`` and reaches ``learning_rate * scale`` after ``warmup_steps`` optimizer steps.
    ``learning_rate`` is a number or a Keras schedule in single-process terms (its factor
    multiplies on top):

        lr = hk.ScaledLRSchedule(keras.optimizers.schedules.CosineDecay(0.1, 10_000), "linear", warmup_steps=500)
        model.compile(optimizer=hk.DistributedOptimizer(keras.optimizers.SGD(lr)), ...)

    ``step`` is the optimizer's ``iterations``, restored from checkpoints, so warmup resumes where
    it stopped. ``size`` defaults to the job's. The rate alone, as a number: ``hk.scaled_lr``; the
    torch counterpart: ``hvdkit.torch.ScaledLRScheduler``.
    """

    def __init__(
        self,
        learning_rate: float | keras.optimizers.schedules.LearningRateSchedule,
        rule: str = "linear",
        warmup_steps: int = 0,
        size: int | None = None,
    ) -> None:
        if not isinstance(learning_rate, keras.optimizers.schedules.LearningRateSchedule):
            what = "a number > 0 or a keras LearningRateSchedule"
            learning_rate = check_number_above("learning_rate", learning_rate, what=what)
        self.learning_rate = learning_rate
        self.rule = rule
        self.warmup_steps = check_warmup_steps(warmup_steps)
        self.size = communicator().size if size is None else size
        self.scale = lr_scale(self.size, rule)

    def __call__(self, step: int | tf.Tensor) -> tf.Tensor:
        step = tf.cast(step, tf.float32)
        base = self.learning_rate(step) if callable(self.learning_rate) else self.learning_rate
        if self.warmup_steps == 0:
            factor = self.scale
        else:
            factor = 1.0 + (self.scale - 1.0) * tf.minimum(step, float(self.warmup_steps)) / self.warmup_steps
        return tf.cast(base, tf.float32) * tf.cast(factor, tf.float32)

    def get_config(self) -> dict[str, Any]:
        lr = self.learning_rate
        if isinstance(lr, keras.optimizers.schedules.LearningRateSchedule):
            lr = keras.saving.serialize_keras_object(lr)
        return {"learning_rate": lr, "rule": self.rule, "warmup_steps": self.warmup_steps, "size": self.size}

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> Self:
        config = dict(config)
        if isinstance(config["learning_rate"], dict):
            config["learning_rate"] = keras.saving.deserialize_keras_object(config["learning_rate"])
        return cls(**config)
