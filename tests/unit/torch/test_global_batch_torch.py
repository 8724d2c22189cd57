"""The torch sampler and LR scheduler at a change of world size, in one process (explicit rank and size)."""

import pytest

torch = pytest.importorskip("torch")

from hvdkit.core.data import epoch_order  # noqa: E402
from hvdkit.torch.data import TrainLoader, TrainSampler  # noqa: E402
from hvdkit.torch.optim import ScaledLRScheduler  # noqa: E402

# torch's first optimizer step sets TORCHINDUCTOR_CACHE_DIR: take it at import, not inside a test
# (the conftest fails a test that changes the environment).
torch.optim.SGD(torch.nn.Linear(1, 1).parameters(), lr=0.1).step()


def test_the_torch_sampler_resumes_at_a_global_offset_at_another_world_size():
    data = torch.utils.data.TensorDataset(torch.arange(50))

    def epoch_batches(size, start, steps=None):
        out, position = [], None
        for r in range(size):
            sampler = TrainSampler(50, 4, global_batch_size=8, rank=r, size=size, seed=2)
            loader = TrainLoader(data, batch_sampler=sampler)
            loader.sampler.set_epoch(1, start=start)  # loader.sampler is the batch sampler
            batches = [b[0].tolist() for b in loader]
            take = len(batches) if steps is None else steps * loader.accumulation
            out += batches[:take]
            position = loader.position(steps if steps is not None else loader.sampler.steps)
        return out, position

    first, offset = epoch_batches(2, 0, steps=3)  # 2 ranks x 1 pass: 3 steps of 8
    assert offset == 24
    rest, end = epoch_batches(1, offset)  # 1 rank x 2 passes from sample 24
    assert end == 50
    assert sorted(sum(first + rest, [])) == list(range(50))
    order = epoch_order(50, seed=2, epoch=1).tolist()
    assert sorted(sum(rest[:2], [])) == sorted(order[24:32])  # the step after the stop: the next 8 of the order


def test_without_a_global_batch_the_lr_rule_is_re_applied_when_a_scheduler_is_restored_at_another_size():
    def scheduled(size):
        opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1)
        return opt, ScaledLRScheduler(opt, rule="linear", warmup_steps=4, size=size)

    opt2, sched2 = scheduled(2)
    for _ in range(2):  # half way through warmup at 2 ranks: 0.1 * (1 + (2 - 1) * 2 / 4)
        opt2.step()
        sched2.step()
    assert opt2.param_groups[0]["lr"] == pytest.approx(0.15)
    opt4, sched4 = scheduled(4)
    opt4.load_state_dict(opt2.state_dict())  # the checkpoint's rate, as Checkpointer restores it first
    sched4.load_state_dict(sched2.state_dict())
    assert opt4.param_groups[0]["lr"] == pytest.approx(0.1 * (1 + 3 * 2 / 4))  # warmup position kept, scale 4
    assert sched4.scale == 4.0 and sched4.last_epoch == 2
    for _ in range(3):
        opt4.step()
        sched4.step()
    assert opt4.param_groups[0]["lr"] == pytest.approx(0.4)  # warmup ends at 0.1 x 4
    opt1, sched1 = scheduled(2)
    opt1.load_state_dict(opt2.state_dict())
    sched1.load_state_dict(sched2.state_dict())
    assert opt1.param_groups[0]["lr"] == opt2.param_groups[0]["lr"]  # same size: untouched, bitwise
