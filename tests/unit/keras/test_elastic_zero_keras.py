"""In-process recovery of a Keras model whose optimizer state is sharded (ZeRO-1), the one-process parts: the elastic
State takes a sharded optimizer (before: ConfigError), a commit holds the unsharded state and ``restore`` puts it
back, the slices are cut anew for any world size from that state (``resize``'s logic, ``_hvdkit_reshard``), and a
sharded optimizer accumulates gradients as the unsharded one does (a smaller size with a fixed global batch).
The recovery itself, on real ranks: tests/e2e/test_in_process_recovery_keras.py (``zero1`` case).
"""

import numpy as np
import pytest
from helpers import probe_fixture

# Importing TensorFlow, Keras and hvdkit.keras sets environment variables: here, at collection (the conftest
# fails a test that changes the environment).
keras = pytest.importorskip("keras")
tf = pytest.importorskip("tensorflow")

import hvdkit.keras as hk  # noqa: E402
from hvdkit.keras import elastic  # noqa: E402
from hvdkit.keras.zero import is_sharded  # noqa: E402

# One real process (hk.init: the sharded optimizer and State ask Horovod its rank and size), which prints what it saw.
_RUN = """
import json, os
import numpy as np, keras, tensorflow as tf
import hvdkit, hvdkit.keras as hk
from hvdkit.core.zero import partition
from hvdkit.keras import elastic
hk.init()
seen = {"hvdkit": hvdkit.__file__}
X = np.linspace(-1, 1, 8 * 3, dtype="float32").reshape(8, 3)
Y = np.sin(2 * X[:, :2]).astype("float32")

def model_with(shard, inner=None):
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(4, activation="tanh"), keras.layers.Dense(2)])
    opt = hk.DistributedOptimizer(inner or keras.optimizers.SGD(0.1, momentum=0.9), shard_optimizer_state=shard)
    model.compile(optimizer=opt, loss="mse")
    return model

def step(model, rows):
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(tf.square(model(X[rows], training=True) - Y[rows]))
    model.optimizer.apply(tape.gradient(loss, model.trainable_variables), model.trainable_variables)

def arrays(values):
    return [np.asarray(v).tolist() for v in values]

def raw(opt):
    return int(next(v for v in opt.variables if v.name == "iteration").numpy())

os.environ["HVDKIT_RECOVERY"] = "in-process"  # built as hk.elastic.fit builds it: with (slice-sized) accumulators
model = model_with(True)
opt = model.optimizer
state = elastic.State(model, step=0)  # before: ConfigError, "does not support shard_optimizer_state=True"
state.save()  # builds it
del os.environ["HVDKIT_RECOVERY"]
seen["accumulators"] = [int(v.shape[0]) for v in opt.variables if v.name.endswith("_gradient_accumulator")]
seen["variables_built"] = len(opt.variables)
for i in range(3):
    step(model, slice(0, 8))
state.step = 3
state.save()
committed = {"weights": arrays(model.get_weights()), "state": arrays(opt.consolidate(to=None))}
seen["committed"] = committed
seen["commit_is_unsharded"] = [list(np.shape(a)) for a in state._commit["optimizer"]]
for i in range(2):  # steps after the commit, then a lost worker
    step(model, slice(0, 8))
state.restore()
seen["restored"] = {"weights": arrays(model.get_weights()), "state": arrays(opt.consolidate(to=None))}
seen["restored_iterations"] = int(opt.iterations.numpy())

# the slices of every rank of another size, cut from the committed unsharded state (resize's logic, no collective)
os.environ["HVDKIT_RECOVERY"] = "in-process"  # resize runs under it (hk.elastic's sync)
cuts = {}
for size in (2, 3, 1):
    parts = []
    for rank in range(size):
        opt._hvdkit_reshard(rank, size)
        opt.load_unsharded(state._commit["optimizer"])
        slot = opt._hvdkit_slot(0, "momentum")
        parts.append({"slice": list(opt._hvdkit_zero.groups[0].slice), "momentum": slot.numpy().tolist(),
                      "variables": len(opt.variables), "iteration": raw(opt)})
    cuts[size] = parts
del os.environ["HVDKIT_RECOVERY"]
seen["cuts"] = cuts
seen["partition_3"] = [list(s) for s in partition(sum(int(np.prod(w.shape)) for w in model.trainable_weights), 3)]
seen["back_at_1"] = arrays(opt.consolidate(to=None))

# a smaller size with a fixed global batch: 2 batches of 4 accumulated, sharded, against 1 batch of 8 unsharded
elastic.set_accumulation(opt, 2)
state.restore()
seen["raw_at_2"] = [raw(opt), int(opt.iterations.numpy())]
plain = model_with(False)
plain.set_weights(state._commit["model"])
plain.optimizer.build(plain.trainable_variables)
for v, a in zip(plain.optimizer.variables, state._commit["optimizer"], strict=True):
    v.assign(np.asarray(a))
for s in range(2):
    step(model, slice(0, 4))
    step(model, slice(4, 8))
    step(plain, slice(0, 8))
seen["accumulated"] = {"sharded": arrays(model.get_weights()), "plain": arrays(plain.get_weights()),
                       "iterations": [int(opt.iterations.numpy()), int(plain.optimizer.iterations.numpy())],
                       "raw": raw(opt)}

# mixed_float16: the loss-scale optimizer around a sharded one, committed and restored with its scale
keras.mixed_precision.set_global_policy("mixed_float16")
os.environ["HVDKIT_RECOVERY"] = "in-process"
lso = keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(0.1, momentum=0.9), initial_scale=64.0)
amp = model_with(True, lso)
state = elastic.State(amp, step=0)
state.save()
del os.environ["HVDKIT_RECOVERY"]
for i in range(2):
    step(amp, slice(0, 8))
amp.optimizer.dynamic_scale.assign(32.0)
amp.optimizer.step_counter.assign(5)
state.save()
before = arrays(amp.optimizer.consolidate(to=None))
step(amp, slice(0, 8))
amp.optimizer.dynamic_scale.assign(8.0)
state.restore()
seen["amp"] = {"sharded": type(amp.optimizer).__name__, "scale": float(amp.optimizer.dynamic_scale.numpy()),
               "good": int(amp.optimizer.step_counter.numpy()), "same": arrays(amp.optimizer.consolidate(to=None)) == before,
               "iterations": int(amp.optimizer.iterations.numpy())}
print(json.dumps(seen))
"""


seen = probe_fixture(_RUN)  # one fresh process for the module's tests


def _flat(arrays):
    return np.concatenate([np.ravel(np.asarray(a, dtype=np.float64)) for a in arrays])


def test_the_elastic_state_takes_a_sharded_optimizer():
    """Before, hk.elastic.State (and so hk.elastic.fit) refused it: ConfigError, 'does not support
    shard_optimizer_state=True for Keras yet'."""
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(3)])
    model.compile(optimizer=hk.DistributedOptimizer(keras.optimizers.SGD(0.1), shard_optimizer_state=True), loss="mse")
    state = elastic.State(model, step=0)
    assert state.optimizer is model.optimizer and is_sharded(state.optimizer)


def test_a_commit_holds_the_unsharded_state_and_restore_puts_it_back(seen):
    # 26 trainable elements (3x4 + 4 + 4x2 + 2); at 1 rank the slice and its accumulator are all of them
    assert seen["accumulators"] == [26]
    # iteration, learning rate, one momentum per variable: the unsharded SGD's variables, no accumulators
    assert seen["commit_is_unsharded"] == [[], [], [3, 4], [4], [4, 2], [2]]
    assert seen["restored"] == seen["committed"]
    assert seen["restored_iterations"] == 3
    assert seen["committed"]["state"][0] == 3 and np.max(np.abs(_flat(seen["committed"]["state"][2:]))) > 1e-3


def test_the_slices_are_cut_anew_for_any_size_from_the_committed_state_and_cover_it_once(seen):
    momentum = _flat(seen["committed"]["state"][2:])  # the unsharded momentum, flat, in variable order
    for size, parts in seen["cuts"].items():
        slices = [tuple(p["slice"]) for p in parts]
        assert slices[0][0] == 0 and slices[-1][1] == 26 and all(a[1] == b[0] for a, b in zip(slices, slices[1:]))
        if size == "3":
            assert [list(s) for s in slices] == seen["partition_3"] == [[0, 9], [9, 18], [18, 26]]
        for p, (lo, hi) in zip(parts, slices, strict=True):
            assert p["momentum"] == momentum[lo:hi].astype(np.float32).tolist()  # this rank's slice, exactly
            assert p["iteration"] == 3  # the step count is kept
            assert p["variables"] == seen["variables_built"]  # the old slices' variables were dropped, not kept
    assert seen["back_at_1"] == seen["committed"]["state"]  # cut at 2 and 3, and back at 1: the same state


def test_a_sharded_optimizer_accumulating_two_half_batches_trains_as_the_unsharded_one_on_the_whole_batch(seen):
    assert seen["raw_at_2"] == [6, 3]  # the raw batch counter at accumulation 2; the optimizer steps stay
    got = seen["accumulated"]
    assert got["iterations"] == [5, 5] and got["raw"] == 10
    sharded, plain = _flat(got["sharded"]), _flat(got["plain"])
    start = _flat(seen["committed"]["weights"])
    assert np.max(np.abs(sharded - start)) > 1e-3  # it trained
    assert np.max(np.abs(sharded - plain)) <= 1e-6  # the mean of 2 half-batch gradients: fp32 rounding


def test_a_sharded_loss_scale_optimizer_is_committed_and_restored_with_its_scale(seen):
    assert seen["amp"] == {"sharded": "LossScaleOptimizer", "scale": 32.0, "good": 5, "same": True, "iterations": 2}
