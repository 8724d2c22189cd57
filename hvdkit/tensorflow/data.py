"""Sharding ``tf.data`` datasets by rank, with a stated rule for sizes that do not divide."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import tensorflow as tf

from ..core.data import BatchPlan, epoch_order, plan_batches, rank_batches, step_bounds
from ..core.errors import ConfigError
from ..core.log import get_logger
from .runtime import rank as _rank
from .runtime import size as _size

__all__ = ["shard", "batch_plan", "epoch_dataset"]

_log = get_logger("data")


def shard(
    dataset: tf.data.Dataset, even: bool = True, rank: int | None = None, size: int | None = None
) -> tf.data.Dataset:
    """This rank's part of ``dataset``: elements rank, rank + size, rank + 2*size, ...

    The rule for n elements that do not divide by size:

    - ``even=True`` (training): the last ``n % size`` elements are dropped, so every rank gets
      exactly ``n // size`` elements and runs the same number of steps (a rank with one batch more
      would wait forever in its extra allreduce). Needs a known size (``dataset.cardinality()``).
    - ``even=False`` (evaluation): every element is used once; the first ``n % size`` ranks get one
      element more. Average metrics with sample counts (``MetricAverageCallback``) for exact results.

    Shard before shuffling and batching.
    """
    rank = _rank() if rank is None else rank
    size = _size() if size is None else size
    if even:
        n = int(dataset.cardinality())
        if n < 0:
            raise ConfigError(
                "shard(even=True) needs a dataset of known size (its cardinality is unknown or infinite); "
                "add .apply(tf.data.experimental.assert_cardinality(n)), or pass even=False"
            )
        dataset = dataset.take((n // size) * size)
    return dataset.shard(size, rank)


def batch_plan(
    batch_size: int,
    global_batch_size: int | None = None,
    backward_passes_per_step: int = 1,
    size: int | None = None,
    log: bool = True,
) -> BatchPlan:
    """The ``BatchPlan`` of this job: per-rank batch x ranks x accumulation steps = global batch.

    With ``global_batch_size`` the accumulation is chosen for this world size (ConfigError naming
    the values when ``batch_size`` x ranks does not divide it); pass ``plan.accumulation`` as the
    ``backward_passes_per_step`` of ``hvdkit.keras.DistributedOptimizer`` and the same numbers to
    ``epoch_dataset``. Rank 0 logs it ("world size 1: global batch 64 = 32 per rank x 1 rank x 2
    accumulation steps") unless ``log`` is False.
    """
    plan = plan_batches(batch_size, _size() if size is None else size, global_batch_size, backward_passes_per_step)
    if log and _rank() == 0:
        _log.info("%s", plan.describe())
    return plan


def epoch_dataset(
    arrays: Any,
    batch_size: int,
    epochs: int,
    initial_epoch: int = 0,
    seed: int = 0,
    shuffle: bool = True,
    rank: int | None = None,
    size: int | None = None,
    global_batch_size: int | None = None,
    backward_passes_per_step: int = 1,
    drop_last: bool = False,
    on_batch: Callable[[int, int, list[int]], object] | None = None,
    start: int = 0,
) -> tuple[tf.data.Dataset, int]:
    """This rank's batches of in-memory ``arrays`` for epochs ``initial_epoch .. epochs-1``, and the
    number of batches per epoch: ``model.fit(ds, steps_per_epoch=steps, epochs=epochs, initial_epoch=...)``.

    Epoch e visits all n samples in an order drawn from (seed, e) alone; each optimizer step takes
    the next global batch of positions and splits it over the ranks x ``accumulation`` batches
    (``hvdkit.core.data``, the rule torch's ``hk.train_loader`` uses): every sample once
    per epoch (``drop_last`` skips the last ``n % global batch`` instead), every rank the same
    number of batches. The order depends only on the epoch, so a run resumed at epoch k sees the
    batches an uninterrupted run saw, and with ``global_batch_size`` (see ``batch_plan``) every
    optimizer step trains on the same samples at any world size. ``on_batch(epoch, step, indices)``,
    if given, is called for each batch, in order, when the input pipeline starts its epoch (so
    ahead of training; ``step``: the optimizer step within the epoch, from 0; ``indices``: the
    sample indices of the batch).

    ``start`` (a mid-epoch resume, ``hvdkit.keras.elastic``): the global sample offset where epoch
    ``initial_epoch`` goes on; the dataset then holds the rest of that one epoch (``epochs`` must be
    ``initial_epoch + 1``) and the number returned is its batches. ``on_batch``'s ``step`` still
    counts from the epoch's start.
    """
    rank = _rank() if rank is None else rank
    size = _size() if size is None else size
    plan = plan_batches(batch_size, size, global_batch_size, backward_passes_per_step)
    tensors = tf.nest.map_structure(tf.convert_to_tensor, arrays)
    n = int(tf.nest.flatten(tensors)[0].shape[0])
    plan.check_dataset(n)
    if start and epochs != initial_epoch + 1:
        raise ConfigError(
            f"epoch_dataset(start={start}) holds the rest of one epoch: pass epochs=initial_epoch + 1 "
            f"(got initial_epoch={initial_epoch}, epochs={epochs}) and make the next epochs' dataset with start=0"
        )
    bounds = step_bounds(n, start, plan.global_batch_size, plan.slots, drop_last)
    before = len(step_bounds(n, 0, plan.global_batch_size, plan.slots, drop_last)) - len(bounds) if start else 0
    k = plan.accumulation
    rows_per_epoch = len(bounds) * k

    def epoch_indices(epoch):  # numpy, run by tf.py_function once per epoch
        epoch = int(epoch)
        rows = list(rank_batches(epoch_order(n, seed, epoch, shuffle), bounds, rank, size, k))
        if on_batch is not None:
            for i, row in enumerate(rows):
                on_batch(epoch, before + i // k, row)
        return np.concatenate(rows).astype(np.int64), np.array([len(r) for r in rows], dtype=np.int64)

    def one_epoch(epoch):
        flat, lengths = tf.py_function(epoch_indices, [epoch], [tf.int64, tf.int64])
        flat.set_shape([None])
        lengths.set_shape([rows_per_epoch])
        return tf.data.Dataset.from_tensor_slices(tf.RaggedTensor.from_row_lengths(flat, lengths))

    ds = tf.data.Dataset.range(initial_epoch, epochs).flat_map(one_epoch)
    ds = ds.map(lambda idx: tf.nest.map_structure(lambda t: tf.gather(t, idx), tensors))
    return ds.prefetch(2), rows_per_epoch
