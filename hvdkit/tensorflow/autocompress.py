"""``compression="auto"`` for TensorFlow and Keras: time fp32 and fp16 allreduces of the gradients' shapes.

    from hvdkit.tensorflow.autocompress import measure_and_choose
    decision = measure_and_choose(model.trainable_variables)   # or a list of tensors / shapes

Used by ``DistributedGradientTape`` and the Keras ``DistributedOptimizer`` when their compression is
``"auto"``: they decide once, at the first ``gradient()``/``apply``, eagerly even while a
``tf.function`` is being traced (``tf.init_scope``), so the choice is a constant of the graph. The
pure decision and the precedence (argument > HVDKIT_COMPRESSION > measurement) live in
``hvdkit.core.autocompress``.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from typing import Any

import tensorflow as tf

from ..core.autocompress import DEFAULT_MARGIN, Decision, decide, fp32_bytes, median, reps_for, resolve_compression
from ..core.errors import ConfigError
from ..core.log import get_logger
from ..core.options import check_positive_int
from ._engine import horovod_tf

__all__ = ["measure_and_choose", "resolve", "time_compressions"]

_log = get_logger("autocompress")


def _shapes(items):
    """Fully known shapes of variables, tensors or shapes (None entries skipped)."""
    shapes = []
    for item in items:
        if item is None:
            continue
        shape = tf.TensorShape(item.shape if hasattr(item, "shape") else item)
        if not shape.is_fully_defined():
            raise ConfigError(
                f"compression='auto' needs fully known gradient shapes (got {shape}); build the model first"
            )
        shapes.append(tuple(shape.as_list()))
    return shapes


@tf.autograph.experimental.do_not_convert  # plain Python run eagerly, also while a tf.function is traced
def time_compressions(
    shapes: Sequence[Sequence[int]], reps: int | None = None, name: str = "hvdkit.autocompress.tf"
) -> tuple[float, float, int, int]:
    """``(fp32_s, fp16_s, nbytes, tensors)``: seconds per grouped allreduce of zeros of ``shapes``, eagerly.

    fp16 includes the casts to half and back. One untimed warm-up each, then ``reps`` of each
    interleaved (``reps`` defaults to ``hvdkit.core.autocompress.reps_for(bytes)``, 5 to 25); each
    figure is the slowest rank's median, the same on every rank.
    Collective: every rank calls it with the same shapes and ``reps``.
    """
    hvd = horovod_tf()
    nbytes = fp32_bytes(shapes)
    reps = reps_for(nbytes) if reps is None else check_positive_int("reps", reps)
    if not shapes:
        raise ConfigError("no gradients to time: the model has no trainable variables")
    with tf.init_scope():  # eager even when called while a tf.function is traced
        fp32 = [tf.zeros(s, tf.float32) for s in shapes]

        def fp32_op():
            return hvd.grouped_allreduce(fp32, op=hvd.Average, name=f"{name}.fp32")[0].numpy()

        def fp16_op():
            wire = [tf.cast(t, tf.float16) for t in fp32]
            out = hvd.grouped_allreduce(wire, op=hvd.Average, name=f"{name}.fp16")
            return [tf.cast(o, tf.float32) for o in out][0].numpy()

        times = {fp32_op: [], fp16_op: []}
        for op in times:
            op()
        for _ in range(reps):
            for op, samples in times.items():
                start = time.perf_counter()
                op()
                samples.append(time.perf_counter() - start)
        local = tf.constant([median(times[fp32_op]), median(times[fp16_op])], tf.float64)
        slowest = hvd.allreduce(local, op=hvd.Max, name=f"{name}.times").numpy()
    return float(slowest[0]), float(slowest[1]), nbytes, len(fp32)


def measure_and_choose(items: Iterable[Any], reps: int | None = None, margin: float = DEFAULT_MARGIN) -> Decision:
    """Time fp32 and fp16 allreduces of ``items``' shapes (variables, tensors or shapes); the Decision.

    Horovod must be initialised (``hvdkit.keras.init()`` / ``hvdkit.tensorflow.init()``). Ignores
    HVDKIT_COMPRESSION (it only measures).
    Collective: every rank calls it with the same shapes.
    """
    fp32_s, fp16_s, nbytes, tensors = time_compressions(_shapes(items), reps)
    return Decision(decide(fp32_s, fp16_s, margin), fp32_s, fp16_s, nbytes, tensors, margin)


@tf.autograph.experimental.do_not_convert
def resolve(compression: str, items: Iterable[Any]) -> str:
    """``"none"`` or ``"fp16"``; with ``"auto"``: HVDKIT_COMPRESSION if set, else measured on ``items``' shapes.

    Rank 0 logs the choice with both times.
    Collective: with ``"auto"`` every rank must call it at the same point.
    Env: HVDKIT_COMPRESSION.
    """
    hvd = horovod_tf()
    size = hvd.size() if hvd.is_initialized() else 1
    log = _log.info if size == 1 or hvd.rank() == 0 else None

    def agree(wanted):
        with tf.init_scope():
            return hvd.broadcast_object(wanted, root_rank=0, name="hvdkit.autocompress.wanted")

    return resolve_compression(compression, lambda: time_compressions(_shapes(items)), size, log=log, agree=agree)[0]
