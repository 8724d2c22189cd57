"""The TensorFlow checkpointer takes the ``extra`` torch's takes (tuples, any scalar keys, tensors) and
gives it back with its types; what would not come back as it was is refused at save time, naming
the key path and type (one process, no MPI)."""

import os
import pathlib

import numpy as np
import pytest

keras = pytest.importorskip("keras")
pytest.importorskip("tensorflow")

from hvdkit.core import ConfigError, LocalCommunicator  # noqa: E402
from hvdkit.core.checkpoint.lock import LOCK_FILE  # noqa: E402
from hvdkit.tensorflow.checkpoint import Checkpointer  # noqa: E402


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    ckpt = Checkpointer(tmp_path_factory.mktemp("tf") / "ckpt", model, comm=LocalCommunicator())
    ckpt.save(step=1, epoch=1, extra={"seen": 1})
    return ckpt


@pytest.mark.parametrize(
    ("extra", "names"),
    [
        ({"seen": np.int64(2)}, "extra['seen'] is a numpy.int64"),  # json.dump failed: was an unexplained error
        ({"best": np.float32(0.5)}, "extra['best'] is a numpy.float32"),  # the same
        ({"w": np.zeros(2)}, "extra['w'] is a numpy.ndarray"),
        ({"data": pathlib.Path("/data")}, "extra['data'] is a pathlib.PosixPath"),
        ({"by": {(1, 2): 0.5}}, "extra['by'] has the key (1, 2) (a tuple)"),
    ],
)
def test_extra_that_would_not_come_back_as_it_was_is_refused_naming_key_and_type(ckpt, extra, names):
    with pytest.raises(ConfigError, match="step 2 was not saved") as err:
        ckpt.save(step=2, epoch=2, extra=extra)
    assert names in str(err.value) and "(nothing was written)" in str(err.value)
    assert sorted(os.listdir(ckpt.store.root)) == [LOCK_FILE, "ckpt-000000000001"]


def test_plain_extra_comes_back_equal_with_its_types(ckpt):
    extra = {"seen": 3, "loss": 0.25, "tags": ["a", None, True], "by_epoch": {"3": [1.5]}}
    ckpt.save(step=3, epoch=3, extra=extra)
    resumed = ckpt.restore()
    assert resumed.step == 3 and resumed.extra == extra
    assert type(resumed.extra["seen"]) is int and type(resumed.extra["loss"]) is float


def test_tuples_int_keys_and_tensors_in_extra_come_back_as_they_were(ckpt):
    import tensorflow as tf

    ckpt.save(step=4, epoch=4, extra={"pos": [0, (1, 2)], "by_epoch": {3: 0.5}, "t": tf.constant([1.5, 2.5])})
    extra = ckpt.restore().extra
    assert extra["pos"] == [0, (1, 2)] and type(extra["pos"][1]) is tuple  # JSON made it a list before
    assert extra["by_epoch"] == {3: 0.5}  # JSON made the key "3" before
    assert isinstance(extra["t"], tf.Tensor) and extra["t"].numpy().tolist() == [1.5, 2.5]
