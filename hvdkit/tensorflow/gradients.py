"""Averaging gradients over ranks: one function used by the tape wrapper and the Keras optimizer."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import tensorflow as tf

from ..core.errors import ConfigError
from ..core.options import AUTO, check_compression
from . import autocompress
from ._engine import compression as _compressor
from ._engine import horovod_tf

__all__ = ["allreduce_gradients", "DistributedGradientTape"]


@tf.autograph.experimental.do_not_convert  # plain Python, no tensor-dependent control flow
def allreduce_gradients(
    grads: Iterable[tf.Tensor | tf.IndexedSlices | None],
    compression: str = "none",
    name: str = "hvdkit.grads",
    groups: int = 1,
) -> list[tf.Tensor | tf.IndexedSlices | None]:
    """The mean over ranks of every gradient in ``grads`` (None entries stay None).

    ``groups=1``: one grouped Horovod allreduce (tensor fusion) named ``name``. ``groups=k > 1``:
    ``k`` grouped allreduces over consecutive slices of the gradients, taken from the end (the
    gradients backward computes first), each starting once its own gradients exist when run inside
    a ``tf.function``; ``groups=0``: one allreduce per gradient (Horovod fuses what is ready in one
    cycle). Works in eager mode and inside ``tf.function``. Sparse gradients (IndexedSlices) are
    gathered, as Horovod does.
    Collective: every rank calls it with gradients of the same shapes, in the same order, and the same ``groups``.
    """
    hvd = horovod_tf()
    grads = list(grads)
    if hvd.size() == 1:
        return grads
    present = [i for i, g in enumerate(grads) if g is not None]
    if not present:
        return grads
    compressor = _compressor(compression)
    for k, part in enumerate(_split(present, groups)):
        reduced = hvd.grouped_allreduce(
            [grads[i] for i in part],
            op=hvd.Average,
            compression=compressor,
            name=name if groups == 1 else f"{name}.{k}",
        )
        for i, g in zip(part, reduced, strict=True):
            grads[i] = g
    return grads


def _split(indices, groups):
    """``indices`` as ``groups`` consecutive slices (0: one each), the last indices first; sizes differ by <= 1."""
    if groups == 0 or groups >= len(indices):
        return [[i] for i in reversed(indices)]
    n, parts, end = len(indices), [], len(indices)
    for k in range(groups):
        size = n // groups + (1 if k < n % groups else 0)
        parts.append(indices[end - size : end])
        end -= size
    return parts


class DistributedGradientTape:
    """A ``tf.GradientTape`` whose ``gradient()`` returns gradients averaged over all ranks.

        with tf.GradientTape() as tape:
            loss = loss_fn(model(x), y)
        tape = hvdkit.tensorflow.DistributedGradientTape(tape, compression="fp16")
        grads = tape.gradient(loss, model.trainable_variables)

    Works with Keras 3 variables, in eager mode and in ``tf.function``. Horovod's own
    ``hvd.DistributedGradientTape`` works too on the engine hvdkit builds (engine fix 10); this one
    sends every gradient in one grouped allreduce under a fixed name and takes compression by name.
    Give two tapes used in one ``tf.function`` different ``name``s.

    ``compression``: ``"none"`` (exact fp32), ``"fp16"`` or ``"auto"``: at the first ``gradient()``
    time both on the sources' shapes and keep fp16 only if > 10 % faster
    (``hvdkit.tensorflow.autocompress``; HVDKIT_COMPRESSION overrides).

    Clipping: ``gradient()`` returns the average, so clip what it returns and every rank clips the
    gradient of the global batch alike: ``grads, _ = tf.clip_by_global_norm(grads, 1.0)`` before
    ``optimizer.apply(grads, variables)``, or give the plain Keras optimizer ``global_clipnorm=1.0``.
    Collective: every rank calls ``gradient()`` the same number of times.
    Env: HVDKIT_COMPRESSION (with ``compression="auto"``).
    """

    def __init__(self, tape: tf.GradientTape, compression: str = "none", name: str = "hvdkit.tape.grads") -> None:
        if not isinstance(tape, tf.GradientTape):
            raise ConfigError(
                f"tape must be a tf.GradientTape (got {type(tape).__name__}); wrap the tape after its `with` block"
            )
        self._tape = tape
        self._compression = check_compression(compression, allow_auto=True)
        self._name = name

    @property
    def compression(self) -> str:
        """``"none"`` or ``"fp16"``: what ``gradient()`` averages in (``"auto"`` until the first call decides)."""
        return self._compression

    def gradient(self, target: Any, sources: Any, output_gradients: Any = None, **kwargs: Any) -> Any:
        grads = self._tape.gradient(target, sources, output_gradients=output_gradients, **kwargs)
        flat = tf.nest.flatten(grads, expand_composites=False)
        if self._compression == AUTO:  # decided once, at the first call, from the gradients' shapes
            self._compression = autocompress.resolve(AUTO, flat)
        flat = allreduce_gradients(flat, self._compression, self._name)
        return tf.nest.pack_sequence_as(grads, flat)

    def __getattr__(self, attr: str) -> Any:  # watch(), stop_recording(), jacobian() ... act on the wrapped tape
        return getattr(self._tape, attr)
