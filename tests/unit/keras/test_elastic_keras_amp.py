"""In-process recovery of a Keras ``mixed_float16`` model, the one-process parts: a commit holds the loss-scale
optimizer's state and ``restore`` puts it back (at another accumulation too), the loss scale acts per optimizer step
when the optimizer inside accumulates, and a Keras ``LossScaleOptimizer`` put around an hvdkit one stays refused.
The recovery itself, on real ranks: tests/e2e/test_in_process_recovery_keras_amp.py.
"""

import pytest
from helpers import probe_fixture

# Importing TensorFlow, Keras and hvdkit.keras sets environment variables: here, at collection (the conftest
# fails a test that changes the environment).
keras = pytest.importorskip("keras")
tf = pytest.importorskip("tensorflow")

import hvdkit.keras as hk  # noqa: E402
from hvdkit.core.errors import ConfigError  # noqa: E402
from hvdkit.keras import elastic  # noqa: E402

# One real process (hk.init: State and the finite check ask Horovod its size), which prints what it saw.
_RUN = """
import json, os
import numpy as np, keras, tensorflow as tf
import hvdkit, hvdkit.keras as hk
from hvdkit.keras import elastic
from hvdkit.keras.elastic.state import accumulation
hk.init()
keras.mixed_precision.set_global_policy("mixed_float16")
seen = {"hvdkit": hvdkit.__file__}

def loss_scaled(accumulation=1, scale=2.0**10, growth=3):
    inner = keras.optimizers.SGD(0.5, momentum=0.9)
    lso = keras.optimizers.LossScaleOptimizer(inner, initial_scale=scale, dynamic_growth_steps=growth)
    return hk.DistributedOptimizer(lso, backward_passes_per_step=accumulation)

def raw(opt):  # the stepping optimizer's batch counter (the wrapper's own "iteration" never counts)
    return next(v for v in opt.inner_optimizer.variables if v.name == "iteration")

def scale_state(opt):
    return [float(opt.dynamic_scale.numpy()), int(opt.step_counter.numpy()), int(opt.iterations.numpy()),
            int(raw(opt).numpy())]

# a commit holds the loss scale and its good steps; restore puts them back, at another accumulation too
os.environ["HVDKIT_RECOVERY"] = "in-process"  # the optimizer gets Keras's accumulators at build
model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(3)])
model.compile(optimizer=loss_scaled(), loss="mse")
opt = model.optimizer
state = elastic.State(model, step=0)
state.save()  # builds the optimizer
momentum = next(v for v in opt.inner_optimizer.variables if "momentum" in v.name)
kernel = model.layers[0].kernel

def put(scale, good, batches, value):
    opt.dynamic_scale.assign(scale)
    opt.step_counter.assign(good)
    raw(opt).assign(batches)
    momentum.assign(np.full(momentum.shape, value, np.float32))
    kernel.assign(np.full(kernel.shape, value, np.float32))

put(64.0, 2, 7, 0.25)  # 7 optimizer steps, not accumulating
state.save()
put(8.0, 0, 9, 0.0)  # what the steps after the commit changed; then a lost worker
state.restore()
seen["restored"] = scale_state(opt) + [float(momentum.numpy().min()), float(kernel.numpy().max())]
elastic.set_accumulation(opt, 2)  # one rank left of two: 2 batches per step
seen["accumulating"] = [opt.inner_optimizer.gradient_accumulation_steps, accumulation(opt)]
seen["converted"] = scale_state(opt)
put(8.0, 0, 19, 0.0)
state.restore()
seen["restored_at_2"] = scale_state(opt)
seen["own_counter"] = int(next(v for v in opt.variables if v.name == "iteration").numpy())
del os.environ["HVDKIT_RECOVERY"]

# at accumulation 2, the loss scale acts per optimizer step
opt = loss_scaled(accumulation=2, scale=4.0, growth=2)
v = keras.Variable(np.zeros(2, np.float32))
opt.build([v])
good, inf = [4.0, 8.0], [np.inf, 8.0]
steps = []
for batches in [(good, good), (inf, good), (good, inf), (good, good), (good, good)]:
    for g in batches:
        opt.apply([tf.constant(g, tf.float32)], [v])
    accumulators = [a for a in opt.inner_optimizer.variables if a.name.endswith("_gradient_accumulator")]
    zero = bool(accumulators) and all(bool(np.all(a.numpy() == 0)) for a in accumulators)
    steps.append(scale_state(opt) + [v.numpy().tolist(), zero])
seen["steps"] = steps

# model.fit builds it at its first apply (accumulating from the start): 4 batches of 2, 2 good steps
model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(3)])
model.compile(optimizer=loss_scaled(accumulation=2, scale=4.0, growth=5), loss="mse")
model.fit(np.ones((8, 2), np.float32), np.ones((8, 3), np.float32), batch_size=2, epochs=1, verbose=0)
seen["fit"] = scale_state(model.optimizer)
print(json.dumps(seen))
"""


seen = probe_fixture(_RUN)  # one fresh process for the module's tests


def test_a_commit_holds_the_loss_scale_and_its_good_steps_and_restore_puts_them_back_at_any_accumulation(seen):
    """Before, hk.elastic.State refused the loss-scale optimizer hk.DistributedOptimizer returns (ConfigError).
    [loss scale, good steps, optimizer steps, raw batch counter]."""
    assert seen["restored"] == [64.0, 2, 7, 7, 0.25, 0.25]  # and the momentum and the weights
    assert seen["accumulating"] == [2, 2]  # set on the optimizer inside, which accumulates
    assert seen["converted"] == [64.0, 2, 7, 14]  # the steps stay, the raw counter counts 2 batches a step
    assert seen["restored_at_2"] == [64.0, 2, 7, 14]
    assert seen["own_counter"] == 0  # the wrapper's own "iteration" is left alone


def test_at_accumulation_2_the_loss_scale_counts_optimizer_steps_and_an_overflow_in_any_batch_skips_the_step(seen):
    """Keras's LossScaleOptimizer alone decides per batch: it counts each batch as a good step, and drops an
    overflowed batch alone so that the next step's first batch completes the step (its raw counter then runs one
    batch ahead of a step's start). [loss scale, good steps, optimizer steps, raw counter, weights, accumulators 0]."""
    weights = [step.pop(4) for step in seen["steps"]]
    assert seen["steps"] == [
        [4.0, 1, 1, 2, True],  # good: one good step counted
        [2.0, 0, 1, 2, True],  # first batch overflowed: skipped, scale halved, the counter back at the step's start
        [1.0, 0, 1, 2, True],  # last batch overflowed: skipped too
        [1.0, 1, 2, 4, True],  # good
        [2.0, 0, 3, 6, True],  # the second good one in a row (growth 2) doubles the scale
    ]
    # SGD(0.5, momentum 0.9) on the mean of g / scale; the skipped steps applied nothing
    assert weights[0] == weights[1] == weights[2] == [-0.5, -1.0]
    assert weights[3] == pytest.approx([-2.95, -5.9], rel=1e-6)  # m = 0.9 m - 0.5 g at scale 1
    assert weights[4] == pytest.approx([-7.155, -14.31], rel=1e-6)


def test_fit_builds_an_accumulating_loss_scale_optimizer_at_its_first_batch_and_counts_its_steps(seen):
    assert seen["fit"] == [4.0, 2, 2, 4]  # [loss scale, good steps, optimizer steps, raw batch counter]


def test_a_keras_loss_scale_optimizer_put_around_an_hvdkit_one_stays_refused_by_hk_elastic():
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(3)])
    model.compile(
        optimizer=keras.optimizers.LossScaleOptimizer(hk.DistributedOptimizer(keras.optimizers.SGD(0.1))), loss="mse"
    )
    with pytest.raises(ConfigError, match="not a keras LossScaleOptimizer around it") as e:
        elastic.State(model)
    assert "hk.DistributedOptimizer(keras.optimizers.LossScaleOptimizer(opt))" in str(e.value)
