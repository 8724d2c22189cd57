"""Keras ``mixed_float16`` with ``hk.DistributedOptimizer``: what it returns, and what it refuses (one process).

Training on 2 ranks, with one rank's gradients overflowing, is in tests/distributed/test_keras_contracts.py.
Refusals come before any collective (at ``build``), so no Horovod job is needed to see them.
"""

import keras
import numpy as np
import pytest

import hvdkit.keras as hk
from hvdkit.core.errors import ConfigError
from hvdkit.keras.zero import is_sharded

FIX = "hk.DistributedOptimizer(keras.optimizers.LossScaleOptimizer(opt))"


@pytest.fixture
def mixed():
    keras.mixed_precision.set_global_policy("mixed_float16")
    yield
    keras.mixed_precision.set_global_policy("float32")


def dense_model():
    return keras.Sequential([keras.Input((2,)), keras.layers.Dense(3)])


@pytest.mark.parametrize("shard", [False, True])
def test_under_mixed_float16_it_returns_a_loss_scale_optimizer_that_compile_keeps(mixed, shard):
    opt = hk.DistributedOptimizer(keras.optimizers.SGD(0.1), shard_optimizer_state=shard)
    assert isinstance(opt, keras.optimizers.LossScaleOptimizer)
    assert hk.is_distributed(opt) and hk.is_distributed(opt.inner_optimizer)
    assert is_sharded(opt) is shard and is_sharded(opt.inner_optimizer) is shard
    assert isinstance(opt.inner_optimizer, keras.optimizers.SGD) and opt.initial_scale == 2.0**15
    model = dense_model()
    model.compile(optimizer=opt, loss="mse")
    assert model.optimizer is opt  # not wrapped again in Keras's own (rank-local) LossScaleOptimizer


def test_under_float32_it_stays_the_plain_optimizers_class():
    opt = hk.DistributedOptimizer(keras.optimizers.SGD(0.1))
    assert not isinstance(opt, keras.optimizers.LossScaleOptimizer) and type(opt).__name__ == "SGD"


@pytest.mark.parametrize("shard", [False, True])
def test_a_given_loss_scale_optimizer_keeps_its_settings_around_the_distributed_one(shard):
    given = keras.optimizers.LossScaleOptimizer(
        keras.optimizers.Adam(0.01), initial_scale=128.0, dynamic_growth_steps=7
    )
    opt = hk.DistributedOptimizer(given, shard_optimizer_state=shard)
    assert (opt.initial_scale, opt.dynamic_growth_steps) == (128.0, 7)
    assert isinstance(opt.inner_optimizer, keras.optimizers.Adam) and hk.is_distributed(opt.inner_optimizer)
    assert is_sharded(opt) is shard
    assert opt.inner_optimizer is not given.inner_optimizer  # a copy, as for any optimizer given


def test_a_loss_scale_optimizer_around_a_non_elementwise_one_is_refused_sharded_naming_the_inner_class():
    given = keras.optimizers.LossScaleOptimizer(keras.optimizers.Lamb(0.01))
    with pytest.raises(ConfigError, match=r"cannot shard Lamb: only optimizers whose update"):
        hk.DistributedOptimizer(given, shard_optimizer_state=True)


def test_a_distributed_optimizer_inside_the_given_loss_scale_optimizer_is_refused():
    given = keras.optimizers.LossScaleOptimizer(hk.DistributedOptimizer(keras.optimizers.SGD(0.1)))
    with pytest.raises(ConfigError, match=r"holds a DistributedOptimizer"):
        hk.DistributedOptimizer(given)


@pytest.mark.parametrize("shard", [False, True])
def test_keras_loss_scale_optimizer_around_it_is_refused_at_build_with_the_fix(shard):
    layer = keras.layers.Dense(3)
    layer.build((None, 2))
    inner = hk.DistributedOptimizer(keras.optimizers.SGD(0.1), shard_optimizer_state=shard)
    opt = keras.optimizers.LossScaleOptimizer(inner)
    with pytest.raises(ConfigError, match=r"decide on each rank's own gradients whether to skip a step") as e:
        opt.build(layer.trainable_variables)
    assert FIX in str(e.value) and not inner.built


def test_keras_loss_scale_optimizer_around_hvdkits_is_refused_too(mixed):
    layer = keras.layers.Dense(3)
    layer.build((None, 2))
    opt = keras.optimizers.LossScaleOptimizer(hk.DistributedOptimizer(keras.optimizers.SGD(0.1)))
    with pytest.raises(ConfigError, match=r"a keras LossScaleOptimizer was put around an hk.DistributedOptimizer"):
        opt.build(layer.trainable_variables)


def test_compile_wrapping_it_for_a_mixed_model_made_before_the_policy_is_refused_at_fit():
    # the model is mixed_float16 but the optimizer was made under float32: compile puts Keras's
    # rank-local LossScaleOptimizer around it, which fit refuses before any collective
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        model = dense_model()
    finally:
        keras.mixed_precision.set_global_policy("float32")
    model.compile(optimizer=hk.DistributedOptimizer(keras.optimizers.SGD(0.1)), loss="mse")
    with pytest.raises(ConfigError, match="set the mixed_float16 policy"):
        model.fit(np.ones((2, 2), "float32"), np.ones((2, 3), "float32"), verbose=0)
