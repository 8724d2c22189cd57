"""The one-process parts of in-process recovery for Keras (``hvdkit.keras.elastic``): the rest of an epoch from a
global sample offset, the accumulation changed on a built optimizer, and the refusal of a ``fit`` outside
``hk.elastic.run`` under ``--recovery in-process``. The recovery itself: tests/e2e/test_in_process_recovery_keras.py.
"""

import numpy as np
import pytest

# Importing TensorFlow, Keras and hvdkit.keras sets environment variables: here, at collection (the conftest
# fails a test that changes the environment).
keras = pytest.importorskip("keras")
tf = pytest.importorskip("tensorflow")

import hvdkit.keras as hk  # noqa: E402
from hvdkit.core.errors import ConfigError  # noqa: E402
from hvdkit.keras import elastic  # noqa: E402
from hvdkit.tensorflow.data import epoch_dataset  # noqa: E402


def batches(start, size=1, rank=0, epoch=1):
    announced = []
    ds, steps = epoch_dataset(
        np.arange(23), 4, epoch + 1, epoch, seed=7, rank=rank, size=size, global_batch_size=8, start=start,
        on_batch=lambda e, s, idx: announced.append((e, s, list(idx))),
    )  # fmt: skip
    got = [b.numpy().tolist() for b in ds]
    assert len(got) == steps
    return got, announced


@pytest.mark.parametrize("size", [1, 2])
def test_the_rest_of_an_epoch_from_a_sample_offset_is_the_tail_of_the_whole_epoch_with_its_step_numbers(size):
    for rank in range(size):
        whole, whole_steps = batches(0, size, rank)
        rest, rest_steps = batches(16, size, rank)  # two optimizer steps of 8 done, one left (7 samples)
        per_step = 2 // size  # micro-batches per step and rank
        assert rest == whole[2 * per_step :] and len(rest) == per_step
        assert rest_steps == whole_steps[2 * per_step :] and {s for _, s, _ in rest_steps} == {2}


def test_the_rest_of_an_epoch_holds_one_epoch_only():
    with pytest.raises(ConfigError, match="epochs=initial_epoch \\+ 1"):
        epoch_dataset(np.arange(23), 4, 3, 1, global_batch_size=8, rank=0, size=1, start=8)


def built(accumulation=1):
    opt = hk.DistributedOptimizer(keras.optimizers.SGD(0.1, momentum=0.9), backward_passes_per_step=accumulation)
    opt.build([keras.Variable(np.zeros(3, np.float32))])
    return opt


def counter(opt):
    return int(next(v for v in opt.variables if v.name == "iteration").numpy())


def test_an_optimizer_built_under_in_process_recovery_can_accumulate_later_and_keeps_its_step_count(monkeypatch):
    monkeypatch.setenv("HVDKIT_RECOVERY", "in-process")
    opt = built()
    assert opt.gradient_accumulation_steps is None  # it does not accumulate: the same maths as without recovery
    next(v for v in opt.variables if v.name == "iteration").assign(6)  # 6 optimizer steps at 2 ranks
    elastic.set_accumulation(opt, 2)  # 1 rank left: 2 batches per step
    assert opt.gradient_accumulation_steps == 2 and counter(opt) == 12 and int(opt.iterations.numpy()) == 6
    elastic.set_accumulation(opt, 1)  # 2 ranks again
    assert opt.gradient_accumulation_steps is None and counter(opt) == 6


def test_an_optimizer_built_without_accumulators_cannot_be_made_to_accumulate_and_says_why():
    opt = built()  # outside in-process recovery: Keras makes no accumulators
    with pytest.raises(ConfigError, match="built without gradient accumulators"):
        elastic.set_accumulation(opt, 2)
    assert opt.gradient_accumulation_steps is None and counter(opt) == 0


def test_a_fit_outside_hk_elastic_run_under_in_process_recovery_stops_at_its_first_step_naming_the_fix(monkeypatch):
    """Before, such a script trained as a fixed-size job under Horovod's elastic driver: the first lost worker ended
    it, with nothing to go back to."""
    monkeypatch.setenv("HVDKIT_RECOVERY", "in-process")
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.compile(optimizer=hk.DistributedOptimizer(keras.optimizers.SGD(0.1)), loss="mse")
    with pytest.raises(ConfigError) as e:
        model.fit(np.ones((4, 2), np.float32), np.ones((4, 1), np.float32), epochs=1, verbose=0)
    assert "the optimizer's apply() was called outside hk.elastic.run" in str(e.value)
    assert "hk.elastic.fit" in str(e.value) and "--recovery restart" in str(e.value)
