"""A Keras 3 optimizer that really averages gradients over ranks."""

import itertools

import keras

from ..core.errors import ConfigError
from ..core.options import check_compression, check_positive_int
from ..tensorflow.gradients import allreduce_gradients

__all__ = ["DistributedOptimizer", "is_distributed"]

_counter = itertools.count()
_classes = {}


class _AveragingMixin:
    """Averages the gradients over ranks in ``apply``, the method every Keras 3 path goes through.

    ``model.fit`` (``apply_gradients`` -> ``apply``), custom loops, eager and ``tf.function``
    all reach ``apply``; Horovod's Keras optimizer hooks methods Keras 3 no longer calls, so its
    ranks silently train apart.
    """

    _hvdkit_compression = "none"
    _hvdkit_name = "hvdkit.optimizer.grads"

    def apply(self, grads, trainable_variables=None):
        grads = allreduce_gradients(grads, self._hvdkit_compression, self._hvdkit_name)
        return super().apply(grads, trainable_variables)


def _distributed_class(base):
    # Same name and module as the wrapped class: a saved model's optimizer config loads as the
    # plain optimizer (re-wrap it to train on many ranks again).
    if base not in _classes:
        _classes[base] = type(base.__name__, (_AveragingMixin, base), {"__module__": base.__module__})
    return _classes[base]


def is_distributed(optimizer):
    """True when ``optimizer`` came from ``DistributedOptimizer``."""
    return isinstance(optimizer, _AveragingMixin)


def DistributedOptimizer(optimizer, compression="none", backward_passes_per_step=1):  # noqa: N802 - mirrors Horovod
    """A copy of the Keras 3 ``optimizer`` (same class and config) that averages gradients over ranks.

    - ``compression``: ``"none"`` (exact fp32) or ``"fp16"`` (half the bytes on the wire).
    - ``backward_passes_per_step``: apply the mean gradient of that many batches; implemented with
      Keras 3's own ``gradient_accumulation_steps``. Gradients are averaged over ranks at every
      batch (Keras accumulates inside ``apply``), so this saves memory and optimizer steps, not
      communication.

    Use it in ``model.compile(optimizer=...)`` or call ``apply``/``apply_gradients`` in a custom
    loop. Pass the plain optimizer: its state (if any) is not copied.
    Collective: every rank must apply gradients the same number of times.
    """
    if not isinstance(optimizer, keras.optimizers.Optimizer):
        raise ConfigError(
            f"optimizer must be a Keras 3 optimizer (got {type(optimizer).__name__}); "
            "create one first, e.g. keras.optimizers.SGD(learning_rate=0.01)"
        )
    if is_distributed(optimizer):
        raise ConfigError("optimizer is already a DistributedOptimizer; wrap the plain optimizer once")
    compression = check_compression(compression)
    check_positive_int("backward_passes_per_step", backward_passes_per_step)
    config = optimizer.get_config()
    if backward_passes_per_step > 1:
        if config.get("gradient_accumulation_steps") not in (None, backward_passes_per_step):
            raise ConfigError(
                f"backward_passes_per_step={backward_passes_per_step} conflicts with the optimizer's "
                f"gradient_accumulation_steps={config['gradient_accumulation_steps']}; set one of them"
            )
        config["gradient_accumulation_steps"] = backward_passes_per_step
    wrapped = _distributed_class(type(optimizer)).from_config(config)
    wrapped._hvdkit_compression = compression
    # Wrapping happens in program order, so the n-th optimizer has the same name on every rank.
    wrapped._hvdkit_name = f"hvdkit.optimizer.{next(_counter)}.grads"
    return wrapped
