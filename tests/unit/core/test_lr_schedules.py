"""The torch and Keras schedules that apply hvdkit.core.lr's scaling and warmup, in one process."""

import math
import re

import pytest

torch = pytest.importorskip("torch")
keras = pytest.importorskip("keras")

from hvdkit.core import ConfigError, warmup_factor  # noqa: E402
from hvdkit.keras import ScaledLRSchedule  # noqa: E402
from hvdkit.torch import ScaledLRScheduler  # noqa: E402

# torch's first optimizer step sets TORCHINDUCTOR_CACHE_DIR: take it at import, not inside a test
# (the conftest fails a test that changes the environment).
torch.optim.SGD(torch.nn.Linear(1, 1).parameters(), lr=0.1).step()


def torch_optimizer(lr=0.1):
    return torch.optim.SGD(torch.nn.Linear(2, 1).parameters(), lr=lr)


def run_schedule(opt, steps, *scheds):
    lrs = []
    for _ in range(steps):
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        for s in scheds:
            s.step()
    return lrs


def test_torch_scaled_lr_scheduler_warms_up_to_twice_and_sqrt_two_times_the_rate_on_two_ranks():
    opt = torch_optimizer()
    lrs = run_schedule(opt, 7, ScaledLRScheduler(opt, "linear", warmup_steps=4, size=2))
    assert lrs == pytest.approx([0.1, 0.125, 0.15, 0.175, 0.2, 0.2, 0.2], rel=1e-12)
    opt = torch_optimizer()
    lrs = run_schedule(opt, 6, ScaledLRScheduler(opt, "sqrt", warmup_steps=4, size=2))
    assert lrs == pytest.approx([0.1 * warmup_factor(s, 4, math.sqrt(2)) for s in range(6)], rel=1e-12)
    opt = torch_optimizer()
    assert run_schedule(opt, 2, ScaledLRScheduler(opt, "linear", size=4)) == pytest.approx([0.4, 0.4], rel=1e-12)


def test_torch_scaled_lr_scheduler_composes_with_a_chainable_torch_scheduler():
    opt = torch_optimizer()
    warm = ScaledLRScheduler(opt, "linear", warmup_steps=4, size=2)
    decay = torch.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.5)
    lrs = run_schedule(opt, 8, warm, decay)
    expected = [0.1 * warmup_factor(t, 4, 2.0) * 0.5 ** (t // 3) for t in range(8)]
    assert lrs == pytest.approx(expected, rel=1e-12)


def test_torch_scaled_lr_scheduler_state_resumes_the_warmup_where_it_stopped():
    opt = torch_optimizer()
    sched = ScaledLRScheduler(opt, "linear", warmup_steps=4, size=2)
    run_schedule(opt, 2, sched)
    state, opt_state = sched.state_dict(), opt.state_dict()
    opt2 = torch_optimizer(lr=0.1)
    sched2 = ScaledLRScheduler(opt2, "linear", warmup_steps=4, size=2)
    opt2.load_state_dict(opt_state)
    sched2.load_state_dict(state)
    assert run_schedule(opt2, 4, sched2) == pytest.approx([0.15, 0.175, 0.2, 0.2], rel=1e-12)


def test_torch_scaled_lr_scheduler_rejects_a_bad_rule_and_a_non_optimizer():
    with pytest.raises(ConfigError, match=re.escape("(got 'log')")):
        ScaledLRScheduler(torch_optimizer(), "log", size=2)
    with pytest.raises(ConfigError, match=re.escape("torch.optim.Optimizer (got str)")):
        ScaledLRScheduler("sgd", size=2)


def test_keras_scaled_schedule_warms_up_and_multiplies_a_user_schedule():
    lin = ScaledLRSchedule(0.1, "linear", warmup_steps=4, size=2)
    assert [float(lin(s)) for s in range(6)] == pytest.approx([0.1, 0.125, 0.15, 0.175, 0.2, 0.2], rel=1e-6)
    sq = ScaledLRSchedule(0.1, "sqrt", warmup_steps=0, size=2)
    assert float(sq(0)) == pytest.approx(0.1 * math.sqrt(2), rel=1e-6)
    decay = keras.optimizers.schedules.ExponentialDecay(0.1, decay_steps=1, decay_rate=0.5)
    both = ScaledLRSchedule(decay, "linear", warmup_steps=2, size=2)
    assert [float(both(s)) for s in range(4)] == pytest.approx([0.1, 0.075, 0.05, 0.025], rel=1e-6)
    again = ScaledLRSchedule.from_config(both.get_config())
    assert float(again(1)) == pytest.approx(0.075, rel=1e-6)
    with pytest.raises(
        ConfigError, match=re.escape("learning_rate must be a number > 0 or a keras LearningRateSchedule (got 0)")
    ):
        ScaledLRSchedule(0, size=2)


@pytest.mark.parametrize("bad", [0, -1.0, math.inf, "1.0", True])
def test_torch_max_grad_norm_must_be_a_finite_positive_number(bad):
    from hvdkit.torch import DistributedOptimizer

    with pytest.raises(
        ConfigError, match=re.escape(f"max_grad_norm must be a finite number > 0 or None (got {bad!r})")
    ):
        DistributedOptimizer(torch_optimizer(), max_grad_norm=bad)
