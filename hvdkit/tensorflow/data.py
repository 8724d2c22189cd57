"""Sharding ``tf.data`` datasets by rank, with a stated rule for sizes that do not divide."""

from ..core.errors import ConfigError
from .runtime import rank as _rank
from .runtime import size as _size

__all__ = ["shard"]


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

