"""``Checkpointer(direct_io=...)``: the arrays written with O_DIRECT restore bitwise; bad values are refused early."""

import pytest

torch = pytest.importorskip("torch")

import hvdkit.core.checkpoint.arrays as arrays_module  # noqa: E402
from hvdkit.core import ConfigError, LocalCommunicator  # noqa: E402
from hvdkit.core.checkpoint.direct import DirectFile  # noqa: E402
from hvdkit.torch.checkpoint import Checkpointer  # noqa: E402

# torch's first optimizer step sets TORCHINDUCTOR_CACHE_DIR: take it at import, not inside a test
# (the conftest fails a test that changes the environment).
torch.optim.SGD(torch.nn.Linear(1, 1).parameters(), lr=0.1).step()


def _model(seed):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(300, 301), torch.nn.Linear(301, 7))  # not whole 4 KiB blocks


@pytest.fixture
def opened(monkeypatch):
    """What each arrays file was opened as: a DirectFile, or None where O_DIRECT was refused or not asked for."""
    seen, real = [], arrays_module.open_direct

    def watched(path):
        seen.append(real(path))
        return seen[-1]

    monkeypatch.setattr(arrays_module, "open_direct", watched)
    return seen


@pytest.mark.parametrize("async_save", [False, True])
def test_a_checkpoint_written_with_direct_io_restores_bitwise(tmp_path, opened, async_save):
    model = _model(0)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.ones(2, 300)).sum().backward()
    opt.step()
    ckpt = Checkpointer(
        tmp_path, model, opt, comm=LocalCommunicator(), async_save=async_save, writer_priority="idle", direct_io=True
    )
    assert ckpt.direct_io is True
    ckpt.save(3, 1, extra={"seen": 3})
    ckpt.wait()
    assert len(opened) == 1
    if not isinstance(opened[0], DirectFile):
        pytest.skip(f"the file system of {tmp_path} refuses O_DIRECT (written through the page cache)")
    fresh = _model(1)
    fresh_opt = torch.optim.SGD(fresh.parameters(), lr=0.1, momentum=0.9)
    resumed = Checkpointer(tmp_path, fresh, fresh_opt, comm=LocalCommunicator()).restore()
    assert (resumed.step, resumed.epoch, resumed.extra) == (3, 1, {"seen": 3})
    for a, b in zip(model.state_dict().values(), fresh.state_dict().values(), strict=True):
        assert torch.equal(a, b)
    for p, q in zip(model.parameters(), fresh.parameters(), strict=True):
        assert torch.equal(opt.state[p]["momentum_buffer"], fresh_opt.state[q]["momentum_buffer"])
    ckpt.store.close()


def test_direct_io_false_writes_through_the_page_cache_at_any_priority(tmp_path, opened):
    model = _model(0)
    for priority in ("normal", "low", "idle"):
        ckpt = Checkpointer(
            tmp_path / priority, model, comm=LocalCommunicator(), writer_priority=priority, direct_io=False
        )
        ckpt.save(1, 0)
        assert ckpt.direct_io is False
        ckpt.store.close()
    assert opened == []  # O_DIRECT was never asked for


@pytest.mark.parametrize("value", ["yes", 1, 0])
def test_a_direct_io_other_than_true_false_or_none_is_a_config_error_naming_them(tmp_path, value):
    with pytest.raises(ConfigError, match=r"direct_io must be True, False or None \(got"):
        Checkpointer(tmp_path / "c", _model(0), comm=LocalCommunicator(), direct_io=value)
    assert not (tmp_path / "c").exists()  # refused before the folder was made
