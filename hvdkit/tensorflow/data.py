"""Sharding ``tf.data`` datasets by rank, with a stated rule for sizes that do not divide."""

import math

import tensorflow as tf

from ..core.errors import ConfigError
from ..core.options import check_positive_int
from .runtime import rank as _rank
from .runtime import size as _size

__all__ = ["shard", "epoch_dataset"]


def shard(dataset, even=True, rank=None, size=None):
    """This rank's part of ``dataset``: elements rank, rank + size, rank + 2*size, ...

    The rule for n elements that do not divide by size:

    - ``even=True`` (training): the last ``n % size`` elements are dropped, so every rank gets
      exactly ``n // size`` elements and runs the same number of steps (a rank with one batch more
      would wait forever in its extra allreduce). Needs a known size (``dataset.cardinality()``).
    - ``even=False`` (evaluation): every element is used once; the first ``n % size`` ranks get one
      element more. Average metrics with sample counts (``MetricAverage``) for exact results.

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



def epoch_dataset(arrays, batch_size, epochs, initial_epoch=0, seed=0, shuffle=True, rank=None, size=None):
    """This rank's batches of in-memory ``arrays`` for epochs ``initial_epoch .. epochs-1``, and the
    number of steps per epoch: ``model.fit(ds, steps_per_epoch=steps, epochs=epochs, initial_epoch=...)``.

    Epoch e is a permutation of all n samples drawn from (seed, e) alone, then split by rank like
    torch's DistributedSampler: rank r takes positions r, r + size, ... of the first
    ``(n // size) * size`` (the rest of that epoch's order is dropped, so every rank runs the
    same number of steps). The order depends only on the epoch, so a run resumed at epoch k sees
    exactly the batches an uninterrupted run saw (``tf.data``'s ``shuffle`` does not: its order
    depends on how many times the dataset was iterated in this process).
    """
    check_positive_int("batch_size", batch_size)
    rank = _rank() if rank is None else rank
    size = _size() if size is None else size
    tensors = tf.nest.map_structure(tf.convert_to_tensor, arrays)
    n = int(tf.nest.flatten(tensors)[0].shape[0])
    per_rank = n // size
    if per_rank == 0:
        raise ConfigError(f"{n} samples cannot be split over {size} ranks; use fewer ranks or more data")

    def one_epoch(epoch):
        if shuffle:
            key = tf.stack([tf.constant(seed, tf.int64), epoch])
            order = tf.argsort(tf.random.stateless_uniform([n], seed=key))
        else:
            order = tf.range(n)
        return tf.data.Dataset.from_tensor_slices(order[rank : per_rank * size : size]).batch(batch_size)

    ds = tf.data.Dataset.range(initial_epoch, epochs).flat_map(one_epoch)
    ds = ds.map(lambda idx: tf.nest.map_structure(lambda t: tf.gather(t, idx), tensors))
    return ds.prefetch(2), math.ceil(per_rank / batch_size)
