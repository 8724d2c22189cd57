"""The tf.data sharding rule, in one process with an explicit rank and size (pure logic)."""

import pytest

tf = pytest.importorskip("tensorflow")

from hvdkit.core import ConfigError  # noqa: E402
from hvdkit.tensorflow.data import shard  # noqa: E402


def elements(ds):
    return [int(x) for x in ds.as_numpy_iterator()]


def test_even_shards_drop_the_remainder_so_every_rank_runs_the_same_steps():
    ds = tf.data.Dataset.range(11)
    parts = [elements(shard(ds, even=True, rank=r, size=3)) for r in range(3)]
    assert parts == [[0, 3, 6], [1, 4, 7], [2, 5, 8]]  # 9 and 10 dropped: 11 % 3 == 2


def test_uneven_shards_keep_every_element_once_for_evaluation():
    ds = tf.data.Dataset.range(11)
    parts = [elements(shard(ds, even=False, rank=r, size=3)) for r in range(3)]
    assert parts == [[0, 3, 6, 9], [1, 4, 7, 10], [2, 5, 8]]
    assert sorted(sum(parts, [])) == list(range(11))


def test_even_sharding_of_a_dataset_of_unknown_size_says_what_to_do():
    ds = tf.data.Dataset.range(10).filter(lambda x: x % 2 == 0)
    with pytest.raises(ConfigError, match="assert_cardinality"):
        shard(ds, even=True, rank=0, size=2)


def test_epoch_dataset_gives_a_resumed_run_the_batches_of_an_uninterrupted_one():
    from hvdkit.tensorflow.data import epoch_dataset

    x = tf.range(10)

    def batches(initial_epoch, rank):
        ds, steps = epoch_dataset(x, batch_size=2, epochs=3, initial_epoch=initial_epoch, seed=5, rank=rank, size=2)
        return [b.numpy().tolist() for b in ds], steps

    full, steps = batches(0, rank=0)
    assert steps == 3 and len(full) == 9  # 5 samples per rank and epoch: batches of 2, 2, 1
    assert batches(2, rank=0)[0] == full[6:]
    other = batches(0, rank=1)[0]
    for e in range(3):  # each epoch: the two ranks together see every sample exactly once
        seen = sum(full[3 * e : 3 * e + 3] + other[3 * e : 3 * e + 3], [])
        assert sorted(seen) == list(range(10))
    assert full[:3] != full[3:6]  # a new order every epoch
