"""An async save whose write is in flight when Horovod shuts down (an in-process reset) is still written, with
the state at ``save()``: the write thread reads nothing from the communicator (size-1 communicator, real threads).
"""

import time

import pytest

torch = pytest.importorskip("torch")

from held_copy import BOUND_S, HeldCopy  # noqa: E402
from shut_down_comm import ShutDownLater  # noqa: E402

from hvdkit.core.checkpoint import verify  # noqa: E402
from hvdkit.core.checkpoint.state import read_newest  # noqa: E402

# torch's first optimizer step sets TORCHINDUCTOR_CACHE_DIR: take it at import, not inside a test
# (the conftest fails a test that changes the environment).
torch.optim.SGD(torch.nn.Linear(1, 1).parameters(), lr=0.1).step()


def _train_step(model, opt, seed):
    g = torch.Generator().manual_seed(seed)
    x, y = torch.randn(8, 16, generator=g), torch.randn(8, 4, generator=g)
    opt.zero_grad()
    torch.nn.functional.mse_loss(model(x), y).backward()
    opt.step()


def test_an_async_save_in_flight_when_horovod_shuts_down_is_written_with_the_state_at_save(tmp_path):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    opt = torch.optim.Adam(model.parameters(), lr=0.1)
    _train_step(model, opt, 1)
    comm = ShutDownLater()
    ckpt = HeldCopy(tmp_path, model, opt, comm=comm, async_save=True)
    ckpt.gate.clear()  # the write thread's copy waits until the test releases it
    expected = {k: v.detach().clone() for k, v in model.state_dict().items()}
    path = ckpt.save(92, 2)
    comm.down = True  # the reset's hvd.shutdown() while the copy and the write are in flight
    ckpt.gate.set()
    _train_step(model, opt, 2)  # waits for the copy; then changes the parameters
    deadline = time.monotonic() + BOUND_S
    while ckpt.store.writing and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not ckpt.store.writing, "the background write never ended"
    comm.down = False  # the reset's hvd.init()
    # before: CheckpointError "the checkpoint of step 92 was not saved: ... (ValueError: Horovod has not been
    # initialized; use hvd.init().)"
    assert ckpt.wait() == path
    assert verify(path)["world_size"] == 1
    snap = read_newest(tmp_path)
    assert (snap.step, snap.epoch, snap.path) == (92, 2, path)
    assert sorted(snap.state["model"]) == sorted(expected)
    for k, v in expected.items():
        assert torch.equal(torch.from_numpy(snap.state["model"][k]), v), k
    assert not torch.equal(model[0].weight, expected["0.weight"])  # the step after the save did change them
    assert [n for n in comm.users if n.startswith("hvdkit-ckpt-write")] == []
    ckpt.store.close()
