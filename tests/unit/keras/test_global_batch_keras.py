"""The Keras input pipeline lays out batches by the core's global-sample-offset rule (one process)."""

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

from hvdkit.core.data import epoch_order, rank_batches, step_bounds  # noqa: E402
from hvdkit.tensorflow.data import epoch_dataset  # noqa: E402


def test_the_keras_dataset_follows_the_same_layout_as_the_core_rule():
    x = np.arange(23)
    for size in (1, 2):
        logged = []
        batches = []
        for r in range(size):
            ds, steps = epoch_dataset(
                x,
                4,
                epochs=2,
                initial_epoch=1,
                seed=7,
                rank=r,
                size=size,
                global_batch_size=8,
                on_batch=lambda e, s, idx, logged=logged: logged.append((e, s, list(idx))),
            )
            got = [b.numpy().tolist() for b in ds]
            assert len(got) == steps == 3 * (2 // size)  # 3 steps of 8 (the last one 7) x accumulation
            assert [x_ for b in got for x_ in b] == [i for _, _, idx in logged[-len(got) :] for i in idx]
            batches += got
        assert sorted(sum(batches, [])) == list(range(23))
        bounds = step_bounds(23, 0, 8, 2)
        expected = [
            i for r in range(size) for b in rank_batches(epoch_order(23, 7, 1), bounds, r, size, 2 // size) for i in b
        ]
        assert sum(batches, []) == expected
