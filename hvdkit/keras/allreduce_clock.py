"""The time a Keras ``DistributedOptimizer`` spends averaging gradients, for ``StragglerMonitorCallback``.

The optimizer only averages; this module times it: ``AllreduceClock.time(average, grads)`` runs
``average(grads)`` and adds the seconds it took (waiting for slower ranks included) to a float64
variable that ``allreduce_seconds(optimizer)`` reads between batches.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import tensorflow as tf

__all__ = ["AllreduceClock", "allreduce_seconds"]


class AllreduceClock:
    """Seconds spent in the gradient allreduce, waiting for the other ranks included (float64).

    A plain holder, so that Keras does not track the variable as optimizer state: it is neither
    checkpointed nor broadcast.
    """

    def __init__(self) -> None:
        self.seconds = tf.Variable(0.0, dtype=tf.float64, trainable=False, name="hvdkit_allreduce_seconds")

    def time(
        self,
        average: Callable[[list[tf.Tensor | tf.IndexedSlices | None]], list[tf.Tensor | tf.IndexedSlices | None]],
        grads: Iterable[tf.Tensor | tf.IndexedSlices | None],
    ) -> list[tf.Tensor | tf.IndexedSlices | None]:
        """``average(grads)``, its duration added to ``seconds``.

        The timestamps are ordered around the allreduce by data and control dependencies, so this
        also holds inside ``tf.function``.
        """
        start = tf.timestamp()
        with tf.control_dependencies([start]):
            grads = [tf.identity(g) if isinstance(g, tf.Tensor) else g for g in grads]
        grads = average(grads)
        with tf.control_dependencies([g for g in grads if isinstance(g, tf.Tensor)]):
            self.seconds.assign_add(tf.timestamp() - start)
        return grads


def allreduce_seconds(optimizer: object) -> float | None:
    """Seconds ``optimizer`` (a ``DistributedOptimizer``) has spent in its gradient allreduce so far.

    Includes the time waiting for slower ranks; ``StragglerMonitorCallback`` subtracts it from batch times.
    None for any other optimizer.
    """
    clock = getattr(optimizer, "_hvdkit_wait", None)
    return float(clock.seconds.numpy()) if isinstance(clock, AllreduceClock) else None
