"""Keras ``mixed_float16`` on many ranks: dynamic loss scaling whose skip decision is the same on every rank.

Keras's ``LossScaleOptimizer`` skips a step, and halves its loss scale, when *its own* gradients hold
an inf or a NaN. Around ``DistributedOptimizer`` that decision is taken on each rank's local
gradients, before the average: a rank whose batch overflowed skips the inner ``apply`` (and its
allreduce) while the others enter it, so the ranks average different steps together and their loss
scales part (16384 on one, 32768 on the other). The loss-scale optimizers made here (by
``hvdkit.keras.DistributedOptimizer`` under ``mixed_float16``, or given a ``LossScaleOptimizer``)
sum the ranks' overflow flags in one allreduce of a single integer before deciding, as
``hvdkit.torch.amp_step`` does: a step that overflowed anywhere is skipped everywhere, and the loss
scale and the step count stay the same on every rank. When the optimizer inside accumulates gradients
(``backward_passes_per_step``, or ``hk.elastic`` at a smaller size), the loss scale acts per optimizer step,
not per batch: a step is skipped when any of its batches overflowed, and counts once toward the scale's growth.

A Keras ``LossScaleOptimizer`` put around the optimizer after ``DistributedOptimizer`` made it
(``keras.optimizers.LossScaleOptimizer(hk.DistributedOptimizer(opt))``, or ``model.compile`` under a
``mixed_float16`` model whose policy was not yet the global one) is refused with ConfigError at the
optimizer's first ``build`` or ``apply``, before any collective: the wrapper sets the inner
optimizer's ``loss_scale_factor`` to None, which is how it is noticed.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from ..core.errors import ConfigError
from ..tensorflow._engine import horovod_tf

__all__ = ["loss_scale_optimizer", "uses_global_loss_scale"]

_KERAS_LSO = keras.optimizers.LossScaleOptimizer


class OuterScalingWatch:
    """Notices a Keras ``LossScaleOptimizer`` put around this optimizer once ``DistributedOptimizer`` returned it.

    ``keras.optimizers.LossScaleOptimizer(inner)`` sets ``inner.loss_scale_factor = None`` (so that the
    inner one does not unscale twice). Keras's own ``__setattr__`` drops that assignment when the value
    is None already, before a property could see it, so it is watched here, and the assigning object
    (the caller's ``self``) told apart from a ``MultiOptimizer``, which does the same to the optimizers
    it holds and is fine. ``_hvdkit_check_unwrapped`` (at ``build`` and ``apply``) raises then.
    """

    _hvdkit_sealed = False  # set by DistributedOptimizer on what it returns (and on the optimizer inside)
    _hvdkit_rewrapped = False

    def __setattr__(self, name, value):
        if name == "loss_scale_factor" and value is None and self._hvdkit_sealed:
            if isinstance(sys._getframe(1).f_locals.get("self"), _KERAS_LSO):
                super().__setattr__("_hvdkit_rewrapped", True)
        super().__setattr__(name, value)

    def _hvdkit_check_unwrapped(self):
        if self._hvdkit_rewrapped:
            raise ConfigError(
                "a keras LossScaleOptimizer was put around an hk.DistributedOptimizer: it would "
                "decide on each rank's own gradients whether to skip a step, so ranks that overflow skip the "
                "gradient average the others enter. Give the LossScaleOptimizer to hk.DistributedOptimizer instead, "
                "hk.DistributedOptimizer(keras.optimizers.LossScaleOptimizer(opt)), or set the mixed_float16 policy "
                "(keras.mixed_precision.set_global_policy) before calling hk.DistributedOptimizer, so that "
                "model.compile keeps the loss-scale optimizer it returns"
            )


class GlobalLossScaleMixin(OuterScalingWatch):
    """Mixed in before ``keras.optimizers.LossScaleOptimizer``: the finite check spans every rank.

    ``check_finite`` allreduces (sum) this rank's 0/1 overflow flag, so the step is skipped and the
    scale halved on every rank as soon as one rank's gradients hold an inf or a NaN. The inner
    optimizer is a ``DistributedOptimizer``: it averages the unscaled gradients, and only on steps
    every rank takes. ``compression`` and the allreduce clock are the inner optimizer's.
    Collective: ``apply`` (one extra allreduce of one integer per step); every rank applies alike.
    """

    @property
    def compression(self) -> str:
        """The inner ``DistributedOptimizer``'s gradient compression (``"none"``, ``"fp16"``, ``"auto"``)."""
        return self.inner_optimizer.compression

    @property
    def _hvdkit_wait(self):
        return getattr(self.inner_optimizer, "_hvdkit_wait", None)  # allreduce_seconds reads it

    def build(self, var_list):
        self._hvdkit_check_unwrapped()
        return super().build(var_list)

    def apply(self, grads, trainable_variables=None):
        self._hvdkit_check_unwrapped()
        steps = self.inner_optimizer.gradient_accumulation_steps
        if not steps:
            return super().apply(grads, trainable_variables)
        if not self.built:
            with keras.name_scope(self.name, caller=self):
                self.build(trainable_variables)
            self.built = True
        return _accumulating_apply(self, list(grads), trainable_variables, steps)

    def check_finite(self, grads):
        return self._hvdkit_everywhere(super().check_finite(grads))

    def _hvdkit_everywhere(self, finite):
        """True when ``finite`` (this rank's flag) is True on every rank: one allreduce of one integer."""
        hvd = horovod_tf()
        if hvd.size() == 1:
            return finite
        name = getattr(self.inner_optimizer, "_hvdkit_name", "hvdkit.optimizer.grads")
        overflowed = hvd.allreduce(tf.cast(tf.logical_not(finite), tf.int32), op=hvd.Sum, name=f"{name}.finite")
        return tf.equal(overflowed, 0)

    def _hvdkit_own_scale_variables(self):
        """This optimizer's own variables (iteration, step counter, loss scale, ...): the same on every rank."""
        variables = list(self.variables)
        return variables[: len(variables) - len(self.inner_optimizer.variables)]


def _accumulating_apply(opt, grads, trainable_variables, steps):
    """``opt.apply`` when the optimizer inside accumulates ``steps`` batches: the loss scale acts per optimizer step.

    Keras's ``LossScaleOptimizer`` decides per batch: it would count each batch as a good step (the scale grows
    ``steps`` times too early) and, on an overflow, drop that batch alone and let the next step's first batch
    complete the sum. Here a step is good when every batch of it, on every rank, is finite: each batch goes into
    the accumulators unscaled (an overflow leaves them non-finite: every rank's, as they hold averaged gradients,
    or, sharded, the slices of the owners of the elements that overflowed; so whether the accumulators are finite
    is asked of every rank, in the same allreduce as the batch's flag); at the step's last batch a good step
    applies and counts as one good step, a bad one applies nothing, halves the scale, empties the accumulators
    and sets the raw batch counter back to the step's start (``iterations`` stays). The scale changes between
    steps only. So a step of ``steps`` batches at ``n / steps`` ranks takes the decisions, scale and count of the
    same samples in one batch at ``n`` ranks (``hk.elastic`` after a lost worker).
    Collective: one allreduce of one integer per batch (``_hvdkit_everywhere``), then the inner ``apply``'s average.
    """
    inner = opt.inner_optimizer
    raw = next(v for v in inner.variables if v.name == "iteration")  # Keras's count of batches
    accumulators = [v for v in inner.variables if v.name.endswith("_gradient_accumulator")]
    variables = list(trainable_variables) if trainable_variables is not None else [None] * len(grads)
    last = keras.ops.equal((raw.value + 1) % steps, 0)
    finite = _KERAS_LSO.check_finite(opt, grads)  # this batch, this rank
    earlier = tf.reduce_all([tf.reduce_all(tf.math.is_finite(a.value)) for a in accumulators])
    good = opt._hvdkit_everywhere(tf.logical_and(finite, earlier))  # on every rank: one allreduce
    scale = opt.dynamic_scale
    unscaled = [
        g if g is None or getattr(v, "overwrite_with_gradient", False) else keras.ops.divide(g, scale)
        for g, v in zip(grads, variables, strict=True)
    ]

    def add_batch():
        inner.apply(unscaled, trainable_variables)

    def grow():
        opt.step_counter.assign(0)
        opt.dynamic_scale.assign(keras.ops.multiply(opt.dynamic_scale, 2.0))

    def count():
        opt.step_counter.assign_add(1)

    def good_step():
        keras.ops.cond(keras.ops.equal(opt.step_counter, opt.dynamic_growth_steps - 1), grow, count)

    def skipped_step():
        opt.step_counter.assign(0)
        opt.dynamic_scale.assign(keras.ops.multiply(opt.dynamic_scale, 0.5))
        for a in accumulators:
            a.assign(keras.ops.zeros(a.shape, dtype=a.dtype))
        raw.assign(raw.value - (steps - 1))  # the step's first batch again: the step did not happen

    keras.ops.cond(tf.logical_or(tf.logical_not(last), good), add_batch, lambda: None)
    keras.ops.cond(last, lambda: keras.ops.cond(good, good_step, skipped_step), lambda: None)


class ShardedLossScaleMixin:
    """The sharded-state calls (``hvdkit.keras.zero``) of a loss-scale optimizer around a sharded one.

    Its own variables come first, then the inner optimizer's, as in ``LossScaleOptimizer.variables``:
    a checkpoint holds what the unsharded loss-scale optimizer would.
    """

    def broadcastable_variables(self) -> list[Any]:
        """The variables that are the same on every rank: this optimizer's own and the inner one's."""
        return self._hvdkit_own_scale_variables() + self.inner_optimizer.broadcastable_variables()

    def unsharded_specs(self) -> list[tuple[tuple[int, ...], str]]:
        """``(shape, dtype)`` of each variable of the unsharded loss-scale optimizer, in its order (no collective)."""
        own = [(tuple(v.shape), str(v.dtype)) for v in self._hvdkit_own_scale_variables()]
        return own + self.inner_optimizer.unsharded_specs()

    def resize(self) -> None:
        """Cut the inner optimizer's slices anew for the job now (``hk.elastic``); its own variables are kept.
        No collective."""
        self.inner_optimizer.resize()

    def consolidated_variables(self, to: int | None = 0) -> list[np.ndarray] | None:
        """The old name of ``consolidate`` (the name of ``hvdkit.core.zero.ShardedState``); the same call."""
        return self.consolidate(to)

    def consolidate(self, to: int | None = 0) -> list[np.ndarray] | None:
        """The unsharded loss-scale optimizer's variables on rank ``to`` (None: every rank); None on the others.

        Collective: every rank calls it alike.
        """
        inner = self.inner_optimizer.consolidate(to=to)
        if inner is None:
            return None
        return [np.array(v.numpy()) for v in self._hvdkit_own_scale_variables()] + inner

    def load_unsharded(self, values: Iterable[Any]) -> None:
        """Set the state from the unsharded loss-scale optimizer's variables, in ``unsharded_specs`` order.

        No collective.
        """
        values = iter(values)
        for v in self._hvdkit_own_scale_variables():
            value = next(values, None)
            if value is None:
                raise ConfigError("the unsharded state ends before the loss-scale optimizer's own variables")
            v.assign(np.asarray(value))
        self.inner_optimizer.load_unsharded(values)


_GlobalLossScale = type("LossScaleOptimizer", (GlobalLossScaleMixin, _KERAS_LSO), {"__module__": _KERAS_LSO.__module__})
_ShardedGlobalLossScale = type(
    "LossScaleOptimizer",
    (ShardedLossScaleMixin, GlobalLossScaleMixin, _KERAS_LSO),
    {"__module__": _KERAS_LSO.__module__},  # a saved model's optimizer loads as Keras's LossScaleOptimizer
)


def loss_scale_optimizer(
    inner: keras.optimizers.Optimizer, like: keras.optimizers.LossScaleOptimizer | None, sharded: bool
) -> keras.optimizers.LossScaleOptimizer:
    """A loss-scale optimizer with the global finite check around ``inner`` (a ``DistributedOptimizer``).

    ``like``: the user's ``LossScaleOptimizer`` whose settings (initial scale, growth steps, name) it
    takes; None: Keras's defaults, named as ``model.compile`` names the one it makes.
    """
    make = _ShardedGlobalLossScale if sharded else _GlobalLossScale
    if like is None:
        return make(inner, name="loss_scale_optimizer")
    return make(inner, initial_scale=like.initial_scale, dynamic_growth_steps=like.dynamic_growth_steps, name=like.name)


def uses_global_loss_scale(optimizer: object) -> bool:
    """True for a loss-scale optimizer made here (its finite check spans every rank)."""
    return isinstance(optimizer, GlobalLossScaleMixin)
