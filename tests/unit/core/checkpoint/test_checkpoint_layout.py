"""The one checkpoint layout both frameworks share (one process, no MPI): what is stored where, that
arrays are written one at a time, that RNG states and schedulers come back alike in torch and
TensorFlow, and that checkpoints of the layout before still restore."""

import gc
import hashlib
import json
import os
import random
import weakref

import numpy as np
import pytest
import torch

from hvdkit.core import CheckpointError, LocalCommunicator
from hvdkit.core.checkpoint import CheckpointStore
from hvdkit.core.checkpoint.arrays import ArrayFile, write_arrays
from hvdkit.core.checkpoint.state import read_newest
from hvdkit.core.checkpoint.tree import decode, encode
from hvdkit.torch.checkpoint import Checkpointer as TorchCheckpointer

# torch's first optimizer step sets TORCHINDUCTOR_CACHE_DIR: take it at import, not inside a test
# (the conftest fails a test that changes the environment).
torch.optim.Adam(torch.nn.Linear(1, 1).parameters(), lr=0.1).step()


class Counter:
    """A scheduler of neither framework: anything with state_dict() and load_state_dict()."""

    def __init__(self, n=0):
        self.n = n

    def state_dict(self):
        return {"n": self.n, "history": (1, 2)}

    def load_state_dict(self, state):
        self.n = state["n"]


def torch_model(seed):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(
        torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4), torch.nn.Linear(4, 2).to(torch.bfloat16)
    )
    opt = torch.optim.Adam(model.parameters(), lr=0.1)
    return model, opt


def test_encode_and_decode_keep_every_type_and_name_each_array():
    tree = {"pair": (1, "a"), 3: [1.5, None, True], None: b"\x00\xff", "t": np.arange(3), "inf": float("inf")}
    found = []
    coded = encode(tree, "extra", found, lambda v: isinstance(v, np.ndarray))
    assert [name for name, _ in found] == ["extra/0"]
    back = decode(json.loads(json.dumps(coded)), lambda name, meta: dict(found)[name])
    assert back.keys() == tree.keys() and back["pair"] == (1, "a") and type(back["pair"]) is tuple
    assert back[3] == [1.5, None, True] and back[None] == b"\x00\xff" and back["inf"] == float("inf")
    assert back["t"] is found[0][1]


def test_arrays_are_written_one_at_a_time_from_a_generator(tmp_path):
    alive = []

    def arrays():
        for i in range(4):
            alive.append(sum(ref() is not None for ref in refs))  # arrays still held when the next is asked for
            a = np.full(1000, i, dtype=np.float32)
            refs.append(weakref.ref(a))
            yield f"model/{i}", a
            del a
            gc.collect()

    refs = []
    write_arrays(tmp_path / "a.npz", arrays())
    assert alive == [0, 0, 0, 0]
    f = ArrayFile(tmp_path / "a.npz")
    assert f.names() == ["model/0", "model/1", "model/2", "model/3"]
    assert isinstance(f.read("model/2"), np.memmap) and f.read("model/2", copy=True).tolist() == [2.0] * 1000
    with np.load(tmp_path / "a.npz") as z:  # a plain .npz
        assert z["model/3"][0] == 3.0


def test_a_torch_checkpoint_keeps_step_epoch_and_extra_only_in_the_manifest(tmp_path):
    model, opt = torch_model(0)
    ckpt = TorchCheckpointer(tmp_path / "ckpt", model, opt, comm=LocalCommunicator())
    path = ckpt.save(step=7, epoch=2, extra={"seen": 7})
    assert sorted(os.listdir(path)) == ["arrays.npz", "manifest.json"]
    manifest = json.loads(open(os.path.join(path, "manifest.json")).read())
    assert (manifest["step"], manifest["epoch"], manifest["world_size"]) == (7, 2, 1)
    assert decode(manifest["meta"]["extra"], None) == {"seen": 7}
    names = ArrayFile(os.path.join(path, "arrays.npz")).names()
    assert all(n.split("/")[0] in ("model", "optimizer", "rng") for n in names), names
    snapshot = read_newest(tmp_path / "ckpt")  # the public reader: no framework needed
    assert (snapshot.step, snapshot.epoch, snapshot.extra) == (7, 2, {"seen": 7})
    assert np.array_equal(snapshot.state["model"]["0.weight"], model.state_dict()["0.weight"].numpy())


def test_torch_restores_params_of_every_dtype_optimizer_scheduler_and_rng(tmp_path):
    model, opt = torch_model(0)
    sched = torch.optim.lr_scheduler.StepLR(opt, 1, 0.5)
    model[0](torch.ones(2, 3)).sum().backward()
    opt.step()
    sched.step()
    TorchCheckpointer(tmp_path / "ckpt", model, opt, sched, comm=LocalCommunicator()).save(step=1, epoch=0)
    want = torch.rand(3), random.random(), np.random.rand()
    model2, opt2 = torch_model(1)
    sched2 = torch.optim.lr_scheduler.StepLR(opt2, 1, 0.5)
    TorchCheckpointer(tmp_path / "ckpt", model2, opt2, sched2, comm=LocalCommunicator()).restore()
    assert torch.equal(torch.rand(3), want[0]) and (random.random(), np.random.rand()) == want[1:]
    for (k, a), b in zip(model.state_dict().items(), model2.state_dict().values()):
        assert a.dtype == b.dtype and torch.equal(a, b), k  # bfloat16 included
    assert torch.equal(opt2.state_dict()["state"][0]["exp_avg"], opt.state_dict()["state"][0]["exp_avg"])
    assert (sched2.last_epoch, opt2.param_groups[0]["lr"]) == (1, 0.05)


def test_a_torch_checkpoint_of_the_layout_before_still_restores(tmp_path):
    """Before: one torch.save of everything in state.pt, step and epoch stored there again."""
    model, opt = torch_model(0)
    extra = {"pair": (1, "a"), "t": torch.arange(2)}
    np_state = np.random.get_state()
    old = {
        "model": model.state_dict(),
        "optimizer": opt.state_dict(),
        "scheduler": None,
        "step": 5,
        "epoch": 1,
        "rng": [
            {
                "torch": torch.get_rng_state(),
                "python": random.getstate(),
                "numpy": (np_state[0], torch.from_numpy(np_state[1].astype(np.int64)), *np_state[2:]),
            }
        ],
        "extra": extra,
    }
    store = CheckpointStore(tmp_path / "ckpt", LocalCommunicator())
    store.save(lambda folder: torch.save(old, os.path.join(folder, "state.pt")), step=5, epoch=1)
    store.close()
    want = torch.rand(2)
    model2, opt2 = torch_model(1)
    resumed = TorchCheckpointer(tmp_path / "ckpt", model2, opt2, comm=LocalCommunicator()).restore()
    assert (resumed.step, resumed.epoch, resumed.extra["pair"]) == (5, 1, (1, "a"))
    assert torch.equal(resumed.extra["t"], torch.arange(2)) and torch.equal(torch.rand(2), want)
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), model2.state_dict().values()))
    with pytest.raises(CheckpointError, match="earlier hvdkit"):
        read_newest(tmp_path / "ckpt")


def test_a_checkpoint_of_a_newer_layout_is_skipped_by_name_not_misread(tmp_path, caplog):
    model, opt = torch_model(0)
    ckpt = TorchCheckpointer(tmp_path / "ckpt", model, opt, comm=LocalCommunicator())
    store = ckpt.store
    store.save(lambda folder: open(os.path.join(folder, "x"), "w").close(), step=9, epoch=0, meta={"layout": 99})
    with pytest.raises(CheckpointError, match="could be loaded; skipped: .*ckpt-000000000009"):
        ckpt.restore()
    assert "ckpt-000000000009 has layout 99, written by a newer hvdkit" in caplog.text


# --------------------------------------------------------------------------- TensorFlow
keras = pytest.importorskip("keras")
tf = pytest.importorskip("tensorflow")

from hvdkit.tensorflow.checkpoint import Checkpointer as TFCheckpointer  # noqa: E402


def keras_model(seed):
    keras.utils.set_random_seed(seed)
    model = keras.Sequential(
        [keras.Input((3,)), keras.layers.Dense(4), keras.layers.Dropout(0.5), keras.layers.Dense(2)]
    )
    model.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse")
    return model


def test_tensorflow_restores_rng_states_and_a_scheduler_as_torch_does(tmp_path):
    model = keras_model(0)
    x = np.ones((8, 3), "float32")
    model.fit(x, x[:, :2], epochs=1, verbose=0)
    TFCheckpointer(tmp_path / "ckpt", model, model.optimizer, Counter(7), comm=LocalCommunicator()).save(
        step=1, epoch=1
    )
    want = tf.random.get_global_generator().normal([3]).numpy(), random.random(), np.random.rand()
    seeds = [v.numpy().tolist() for v in model.variables if "seed" in v.path]
    fresh, counter = keras_model(5), Counter()
    resumed = TFCheckpointer(tmp_path / "ckpt", fresh, fresh.optimizer, counter, comm=LocalCommunicator()).restore()
    got = tf.random.get_global_generator().normal([3]).numpy(), random.random(), np.random.rand()
    assert np.array_equal(got[0], want[0]) and got[1:] == want[1:]  # not restored at all before
    assert [v.numpy().tolist() for v in fresh.variables if "seed" in v.path] == seeds  # the dropout layer's
    assert counter.n == 7 and resumed.step == 1
    for a, b in zip(model.weights + model.optimizer.variables, fresh.weights + fresh.optimizer.variables):
        assert np.array_equal(a.numpy(), b.numpy()), a.path


def test_a_tensorflow_checkpoint_of_the_layout_before_still_restores(tmp_path):
    """Before: state.npz of model/<i> and optimizer/<i> arrays, extra in the manifest's meta, no RNG states."""
    model = keras_model(0)
    arrays = {f"model/{i}": v.numpy() for i, v in enumerate(model.weights)}
    model.optimizer.build(model.trainable_variables)
    opt_vars = [v for v in model.optimizer.variables if not v.name.endswith("_gradient_accumulator")]
    arrays.update({f"optimizer/{i}": v.numpy() for i, v in enumerate(opt_vars)})
    store = CheckpointStore(tmp_path / "ckpt", LocalCommunicator())
    store.save(
        lambda folder: np.savez(os.path.join(folder, "state.npz"), **arrays),
        step=4,
        epoch=2,
        meta={"extra": {"seen": 4}, "accumulation": 1},
    )
    store.close()
    fresh = keras_model(3)
    resumed = TFCheckpointer(tmp_path / "ckpt", fresh, fresh.optimizer, comm=LocalCommunicator()).restore()
    assert (resumed.step, resumed.epoch, resumed.extra) == (4, 2, {"seen": 4})
    assert all(np.array_equal(a.numpy(), b.numpy()) for a, b in zip(model.weights, fresh.weights))


def test_a_positional_keep_of_the_signature_before_still_works_with_a_warning(tmp_path):
    model = keras_model(0)
    with pytest.warns(DeprecationWarning, match="the fourth argument is the scheduler now"):
        ckpt = TFCheckpointer(tmp_path / "ckpt", model, model.optimizer, 2, LocalCommunicator())
    assert (ckpt.store.keep, ckpt.scheduler) == (2, None)


def test_an_array_larger_than_the_write_pieces_is_hashed_and_synced_on_the_way(tmp_path, monkeypatch):
    import hvdkit.core.checkpoint.arrays as arrays_module

    synced = []
    real = os.fdatasync
    monkeypatch.setattr(arrays_module, "_CHUNK", 1000)  # many pieces, several early disk writes
    monkeypatch.setattr(arrays_module, "_SYNC_EVERY", 4000)
    monkeypatch.setattr(arrays_module.os, "fdatasync", lambda fd: (synced.append(os.fstat(fd).st_size), real(fd)))
    big = np.arange(10_001, dtype=np.float64)  # 80,008 bytes: not a whole number of pieces
    digest = write_arrays(tmp_path / "a.npz", [("big", big), ("small", np.ones(3))])
    data = (tmp_path / "a.npz").read_bytes()
    assert digest == hashlib.sha256(data).hexdigest()
    assert synced, "no disk write was started while writing"
    assert np.array_equal(ArrayFile(tmp_path / "a.npz").read("big"), big)


def test_a_disk_write_that_fails_while_writing_fails_the_write(tmp_path, monkeypatch):
    import hvdkit.core.checkpoint.arrays as arrays_module

    def broken(fd):
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(arrays_module, "_SYNC_EVERY", 1)
    monkeypatch.setattr(arrays_module.os, "fdatasync", broken)
    with pytest.raises(OSError, match="Input/output error"):
        write_arrays(tmp_path / "a.npz", [("x", np.ones(100))])
