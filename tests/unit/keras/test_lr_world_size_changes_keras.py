"""The Keras learning rate across world-size changes and resumes, in one process: a checkpoint saved
by a job of one size and restored by a job of another gives, at every optimizer step, the rate an
uninterrupted run has there. A ``ScaledLRSchedule`` follows the size in force (its rule re-applied,
never carried over); under a fixed global batch the accumulation per rank changes with the size
(Keras's ``gradient_accumulation_steps``, its raw counter counting micro-batches), and a schedule
must still see optimizer steps, so the rates do not depend on the sizes at all.

Sizes are the schedules' ``size=`` and ``batch_plan(size=)``; the checkpoints go through the real
``Checkpointer`` with the size-1 communicator. The rate a step used is measured from the update it
made: SGD without momentum on float64 weights whose gradient is 1, so the weight moves by the rate.
The torch counterpart: tests/unit/torch/test_lr_world_size_changes_torch.py.
"""

import tempfile

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

# Importing TensorFlow, Keras and hvdkit.keras sets environment variables: here, at collection, not
# inside a test (the conftest fails a test that changes the environment).
keras = pytest.importorskip("keras")
tf = pytest.importorskip("tensorflow")

from hvdkit.core import LocalCommunicator, lr_scale, warmup_factor  # noqa: E402
from hvdkit.keras import DistributedOptimizer, ScaledLRSchedule, batch_plan  # noqa: E402
from hvdkit.tensorflow.checkpoint import Checkpointer  # noqa: E402

BASE_LR = 0.1
GLOBAL_BATCH = 8  # samples per optimizer step, whatever the size: accumulation = 8 / (1 per rank x size)
X = tf.ones((1, 2), tf.float64)


def one_process(opt):
    """``opt`` standing for ``size`` ranks that all see the same batch: the mean over them is this
    process's own gradient, taken without Horovod (``apply`` needs ``hk.init()`` for its allreduce)."""
    opt._hvdkit_average = list
    return opt


def job(schedule, accumulation):
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1, dtype="float64")])
    opt = DistributedOptimizer(keras.optimizers.SGD(schedule), backward_passes_per_step=accumulation)
    return model, one_process(opt)


def micro_batch(model, opt):
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(model(X))  # d loss / d bias = 1
    opt.apply(tape.gradient(loss, model.trainable_variables), model.trainable_variables)


def train_leg(directory, schedule, steps, accumulation=1):
    """One job: restore from ``directory``, take ``steps`` optimizer steps of ``accumulation`` micro-batches, save.

    Returns the rate each step applied, by global optimizer step."""
    model, opt = job(schedule, accumulation)
    ckpt = Checkpointer(directory, model, opt, comm=LocalCommunicator())
    resumed = ckpt.restore()
    start = resumed.step if resumed else 0
    assert int(opt.iterations) == start
    bias = model.trainable_variables[1]
    used = {}
    for t in range(start, start + steps):
        before = float(bias[0])
        for _ in range(accumulation):
            micro_batch(model, opt)
        used[t] = before - float(bias[0])  # SGD: bias -= rate * mean gradient (1)
    assert int(opt.iterations) == start + steps
    ckpt.save(step=start + steps, epoch=0)
    return used


def fixed_global_batch_leg(directory, size, steps, decay):
    plan = batch_plan(1, GLOBAL_BATCH, size=size, log=False)  # 1 sample per rank per micro-batch
    return train_leg(directory, keras.optimizers.schedules.ExponentialDecay(BASE_LR, **decay), steps, plan.accumulation)


def decayed(t, decay_steps, decay_rate, staircase):
    """ExponentialDecay's rate at optimizer step ``t``."""
    p = t // decay_steps if staircase else t / decay_steps
    return BASE_LR * decay_rate**p


def test_restored_at_twice_the_size_the_scaled_rate_follows_the_new_size_after_the_warmup(tmp_path):
    train_leg(tmp_path, ScaledLRSchedule(BASE_LR, "linear", warmup_steps=4, size=1), steps=6)
    used = train_leg(tmp_path, ScaledLRSchedule(BASE_LR, "linear", warmup_steps=4, size=2), steps=2)
    assert used == pytest.approx({6: 0.2, 7: 0.2}, rel=1e-6)


def test_under_a_fixed_global_batch_a_resume_at_another_accumulation_goes_on_at_the_same_optimizer_step(tmp_path):
    """4 ranks (accumulation 2) for 3 steps, then 1 rank (accumulation 8): step 3 uses the rate of step 3.

    Keras's raw counter stands at 6 micro-batches when it is saved; the resume makes it 24, not 6 (step 0)."""
    decay = {"decay_steps": 1, "decay_rate": 0.5}
    assert fixed_global_batch_leg(tmp_path, 4, 3, decay) == pytest.approx({0: 0.1, 1: 0.05, 2: 0.025}, rel=1e-6)
    assert fixed_global_batch_leg(tmp_path, 1, 2, decay) == pytest.approx({3: 0.0125, 4: 0.00625}, rel=1e-6)


legs = st.lists(
    st.tuples(st.integers(1, 4), st.integers(1, 4), st.sampled_from([1, 2, 3])), min_size=1, max_size=4
)  # (size, optimizer steps, backward_passes_per_step)


@settings(max_examples=20, deadline=None)
@given(
    legs=legs,
    rule=st.sampled_from(["linear", "sqrt", "none"]),
    warmup_steps=st.integers(0, 6),
    decay_rate=st.sampled_from([None, 0.8]),
)
@example(legs=[(1, 3, 1), (2, 2, 3), (4, 3, 2)], rule="linear", warmup_steps=5, decay_rate=0.8)
def test_any_sequence_of_sizes_and_resumes_uses_the_scaled_rate_of_an_uninterrupted_run_at_each_size(
    legs, rule, warmup_steps, decay_rate
):
    """``ScaledLRSchedule`` (of a constant or of an ExponentialDecay), with or without accumulation."""
    used, expected = {}, {}
    with tempfile.TemporaryDirectory() as directory:
        for size, steps, accumulation in legs:
            base = BASE_LR
            if decay_rate is not None:
                base = keras.optimizers.schedules.ExponentialDecay(BASE_LR, decay_steps=1, decay_rate=decay_rate)
            leg = train_leg(directory, ScaledLRSchedule(base, rule, warmup_steps, size=size), steps, accumulation)
            used.update(leg)
            scale = lr_scale(size, rule)
            for t in leg:
                decay = 1.0 if decay_rate is None else decay_rate**t
                expected[t] = BASE_LR * decay * warmup_factor(t, warmup_steps, scale)
    assert list(used) == list(range(sum(steps for _, steps, _ in legs)))
    assert used == pytest.approx(expected, rel=1e-6)


@settings(max_examples=20, deadline=None)
@given(
    legs=st.lists(st.tuples(st.sampled_from([1, 2, 4, 8]), st.integers(1, 4)), min_size=1, max_size=4),
    decay_steps=st.integers(1, 3),
    decay_rate=st.sampled_from([0.5, 0.8]),
    staircase=st.booleans(),
)
@example(legs=[(8, 2), (1, 3), (2, 2), (8, 1)], decay_steps=1, decay_rate=0.5, staircase=False)
def test_under_a_fixed_global_batch_any_sequence_of_sizes_and_resumes_uses_the_rate_of_an_uninterrupted_run(
    legs, decay_steps, decay_rate, staircase
):
    """A Keras ExponentialDecay; accumulation 8 / size (1 at 8 ranks: Keras's counter then counts steps)."""
    decay = {"decay_steps": decay_steps, "decay_rate": decay_rate, "staircase": staircase}
    used = {}
    with tempfile.TemporaryDirectory() as directory:
        for size, steps in legs:
            used.update(fixed_global_batch_leg(directory, size, steps, decay))
    expected = {t: decayed(t, decay_steps, decay_rate, staircase) for t in range(sum(steps for _, steps in legs))}
    assert used == pytest.approx(expected, rel=1e-6)
