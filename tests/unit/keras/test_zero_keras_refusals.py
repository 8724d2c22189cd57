"""``hk.DistributedOptimizer(..., shard_optimizer_state=True)`` refuses, with the fix, what it cannot shard.

Refusals come before any collective (at construction, or at ``build`` for what is set later), so
every rank raises alike and nothing hangs; no Horovod job is needed to see them.
"""

import keras
import pytest

import hvdkit.keras as hk
from hvdkit.core.errors import ConfigError
from hvdkit.keras.zero import ELEMENTWISE_OPTIMIZERS, check_shardable, is_sharded

FIX = "pass shard_optimizer_state=False"


class MyAdam(keras.optimizers.Adam):
    """A subclass may change the update: refused although Adam is allowed."""


@pytest.mark.parametrize(
    "make",
    [
        lambda: keras.optimizers.Lamb(0.01),
        lambda: keras.optimizers.Adafactor(0.01),
        lambda: keras.optimizers.Muon(0.01),
        lambda: MyAdam(0.01),
    ],
)
def test_a_non_elementwise_optimizer_is_refused_naming_its_class_and_the_fix(make):
    opt = make()
    with pytest.raises(ConfigError, match=rf"cannot shard {type(opt).__name__}: only optimizers whose update") as e:
        hk.DistributedOptimizer(opt, shard_optimizer_state=True)
    assert FIX in str(e.value) and "Adam, AdamW" in str(e.value)


@pytest.mark.parametrize("cls", ELEMENTWISE_OPTIMIZERS)
def test_every_allowed_optimizer_is_wrapped_sharded_of_its_own_class(cls):
    opt = hk.DistributedOptimizer(cls(learning_rate=0.01), shard_optimizer_state=True)
    assert isinstance(opt, cls) and type(opt).__name__ == cls.__name__
    assert is_sharded(opt) and hk.is_distributed(opt)
    assert not is_sharded(hk.DistributedOptimizer(cls(learning_rate=0.01)))


@pytest.mark.parametrize(
    ("make", "match"),
    [
        (
            lambda: keras.optimizers.SGD(0.1, clipnorm=1.0),
            r"clip each variable to its own norm \(clipnorm=1.0\).*global_clipnorm",
        ),
        (lambda: keras.optimizers.Adam(0.1, use_ema=True), r"does not support use_ema=True"),
    ],
)
def test_per_variable_clipping_and_ema_are_refused_with_the_fix(make, match):
    with pytest.raises(ConfigError, match=match) as e:
        hk.DistributedOptimizer(make(), shard_optimizer_state=True)
    assert FIX in str(e.value)


def test_global_clipnorm_and_clipvalue_are_accepted():
    check_shardable(keras.optimizers.SGD(0.1, global_clipnorm=1.0))
    check_shardable(keras.optimizers.SGD(0.1, clipvalue=1.0))


def test_gradient_accumulation_is_accepted_sharded():
    """Before, refused (ConfigError); Keras now accumulates each rank's slice of the averaged gradients (hk.elastic
    needs it at a smaller size with a fixed global batch). Trained: tests/unit/keras/test_elastic_zero_keras.py."""
    opt = hk.DistributedOptimizer(keras.optimizers.SGD(0.1), backward_passes_per_step=4, shard_optimizer_state=True)
    assert is_sharded(opt) and opt.gradient_accumulation_steps == 4
    check_shardable(keras.optimizers.Adam(0.1, gradient_accumulation_steps=2))


def test_shard_optimizer_state_must_be_a_bool():
    with pytest.raises(ConfigError, match=r"shard_optimizer_state must be True or False \(got 'yes'\)"):
        hk.DistributedOptimizer(keras.optimizers.SGD(0.1), shard_optimizer_state="yes")


def test_weight_decay_exclusions_are_refused_at_build_before_any_collective():
    layer = keras.layers.Dense(3)
    layer.build((None, 2))
    opt = hk.DistributedOptimizer(keras.optimizers.AdamW(0.1, weight_decay=0.1), shard_optimizer_state=True)
    opt.exclude_from_weight_decay(var_names=["bias"])
    with pytest.raises(ConfigError, match=r"cannot exclude variables from weight decay.*drop the exclusion") as e:
        opt.build(layer.trainable_variables)
    assert FIX in str(e.value) and not opt.built


def test_clipnorm_set_after_construction_is_refused_at_build():
    layer = keras.layers.Dense(3)
    layer.build((None, 2))
    opt = hk.DistributedOptimizer(keras.optimizers.SGD(0.1), shard_optimizer_state=True)
    opt.clipnorm = 0.5
    with pytest.raises(ConfigError, match=r"clipnorm=0.5"):
        opt.build(layer.trainable_variables)
