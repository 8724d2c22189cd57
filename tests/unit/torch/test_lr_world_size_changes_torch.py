"""The torch learning rate across world-size changes, in one process: a checkpoint saved by a job of
one size and restored by a job of another gives, at every optimizer step, the rate an uninterrupted
run at the new size has there (the rule re-applied once, never twice). Sizes are the schedulers'
``size=``; the checkpoints go through the real ``Checkpointer`` with the size-1 communicator."""

import tempfile

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hvdkit.core import LocalCommunicator, lr_scale, warmup_factor
from hvdkit.torch import ScaledLRScheduler
from hvdkit.torch.checkpoint import Checkpointer

BASE_LR = 0.1

# torch's first optimizer step sets TORCHINDUCTOR_CACHE_DIR: take it at import, not inside a test
# (the conftest fails a test that changes the environment).
torch.optim.SGD(torch.nn.Linear(1, 1).parameters(), lr=0.1).step()


def job(size, rule, warmup_steps):
    model = torch.nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=BASE_LR)
    return model, opt, ScaledLRScheduler(opt, rule, warmup_steps=warmup_steps, size=size)


def train_leg(directory, size, steps, rule="linear", warmup_steps=4):
    """One job of ``size`` ranks: restore from ``directory``, take ``steps`` optimizer steps, save.

    Returns the rate each step used, by global step."""
    model, opt, sched = job(size, rule, warmup_steps)
    ckpt = Checkpointer(directory, model, opt, sched, comm=LocalCommunicator())
    resumed = ckpt.restore()
    start = resumed.step if resumed else 0
    used = {}
    for t in range(start, start + steps):
        used[t] = opt.param_groups[0]["lr"]
        model(torch.ones(1, 2)).sum().backward()
        opt.step()
        opt.zero_grad()
        sched.step()
    ckpt.save(step=start + steps, epoch=0)
    return used


def test_restored_at_twice_the_size_the_rate_is_scaled_once_not_squared(tmp_path):
    """Saved at 1 rank after the warmup, restored at 2: the linear rule gives 0.2 (it gave 0.4)."""
    train_leg(tmp_path, size=1, steps=6)
    assert train_leg(tmp_path, size=2, steps=2) == pytest.approx({6: 0.2, 7: 0.2}, rel=1e-12)


def test_restored_mid_warmup_at_another_size_the_warmup_goes_on_at_the_new_scale(tmp_path):
    train_leg(tmp_path, size=4, steps=2)  # 0.1, 0.175
    used = train_leg(tmp_path, size=2, steps=4)
    assert used == pytest.approx({t: BASE_LR * warmup_factor(t, 4, 2.0) for t in range(2, 6)}, rel=1e-12)


def test_loading_the_same_scheduler_state_twice_rescales_once():
    _, opt, sched = job(1, "linear", 0)
    opt_state, sched_state = opt.state_dict(), sched.state_dict()
    _, opt2, sched2 = job(2, "linear", 0)
    opt2.load_state_dict(opt_state)
    sched2.load_state_dict(sched_state)
    sched2.load_state_dict(sched_state)
    assert [g["lr"] for g in opt2.param_groups] == pytest.approx([0.2], rel=1e-12)
    assert sched2.get_last_lr() == pytest.approx([0.2], rel=1e-12)


def test_an_optimizer_state_without_the_carried_scale_is_rescaled_from_the_schedulers_state():
    """Optimizer states saved by hvdkit before the carried scale: the scheduler's saved scale counts."""
    _, opt, sched = job(1, "linear", 0)
    opt_state = opt.state_dict()
    for group in opt_state["param_groups"]:
        del group["hvdkit_lr_scale"]
    _, opt2, sched2 = job(3, "linear", 0)
    opt2.load_state_dict(opt_state)
    sched2.load_state_dict(sched.state_dict())
    assert opt2.param_groups[0]["lr"] == pytest.approx(0.3, rel=1e-12)


legs = st.lists(st.tuples(st.integers(1, 4), st.integers(1, 4)), min_size=1, max_size=4)


@settings(max_examples=25, deadline=None)
@given(legs=legs, rule=st.sampled_from(["linear", "sqrt", "none"]), warmup_steps=st.integers(0, 6))
def test_any_sequence_of_sizes_and_resumes_uses_the_rate_of_an_uninterrupted_run_at_each_size(legs, rule, warmup_steps):
    used, expected = {}, {}
    with tempfile.TemporaryDirectory() as directory:
        for size, steps in legs:
            leg = train_leg(directory, size, steps, rule, warmup_steps)
            used.update(leg)
            expected.update({t: BASE_LR * warmup_factor(t, warmup_steps, lr_scale(size, rule)) for t in leg})
    assert used == pytest.approx(expected, rel=1e-9)
