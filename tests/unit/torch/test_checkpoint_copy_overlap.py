"""An async save's copy of the state leaves ``save()``: the write thread copies the parameters and the optimizer
state while forward and backward run, and what changes them waits for it (size-1 communicator, real threads).

``HeldCopy`` holds that copy in the write thread until the test opens its gate, so the order of events is
the test's, not the scheduler's: whatever the machine's load, the checkpoint must be the state at ``save()``.
"""

import copy
import os
import threading

import pytest

torch = pytest.importorskip("torch")

from held_copy import HeldCopy  # noqa: E402

from hvdkit.core import ConfigError, LocalCommunicator  # noqa: E402
from hvdkit.core.checkpoint.state import read_newest  # noqa: E402
from hvdkit.torch.checkpoint import Checkpointer  # noqa: E402

# torch's first optimizer step sets TORCHINDUCTOR_CACHE_DIR: take it at import, not inside a test
# (the conftest fails a test that changes the environment).
torch.optim.SGD(torch.nn.Linear(1, 1).parameters(), lr=0.1).step()


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.BatchNorm1d(32), torch.nn.Linear(32, 4))


def _backward(model, seed):
    g = torch.Generator().manual_seed(seed)
    x, y = torch.randn(8, 16, generator=g), torch.randn(8, 4, generator=g)
    torch.nn.functional.mse_loss(model(x), y).backward()


def _train_step(model, opt, seed):
    opt.zero_grad()
    _backward(model, seed)
    opt.step()


def _saved_now(model, opt):
    """The model's and the optimizer's tensors as they are now (copies), by the keys a checkpoint stores."""
    model_state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    opt_state = [v.clone() for s in opt.state_dict()["state"].values() for v in s.values() if torch.is_tensor(v)]
    return model_state, opt_state


def _same_as_checkpoint(directory, expected):
    """Whether the newest checkpoint under ``directory`` holds exactly (bitwise) ``expected``."""
    model_state, opt_state = expected
    snap = read_newest(directory)
    saved_model = snap.state["model"]
    saved_opt = [v for s in snap.state["optimizer"]["state"].values() for v in s.values() if hasattr(v, "shape")]
    same_model = sorted(saved_model) == sorted(model_state) and all(
        torch.equal(torch.from_numpy(saved_model[k]), v) for k, v in model_state.items()
    )
    same_opt = len(saved_opt) == len(opt_state) and all(
        torch.equal(torch.from_numpy(a).reshape(b.shape), b) for a, b in zip(saved_opt, opt_state, strict=True)
    )
    return same_model and same_opt


def _release_after(ckpt, seconds):
    def release():
        ckpt.events.append("copy released")
        ckpt.gate.set()

    timer = threading.Timer(seconds, release)
    timer.start()
    return timer


def test_save_returns_before_the_parameters_are_copied_and_the_optimizer_step_waits_for_the_copy(tmp_path):
    model = _model()
    opt = torch.optim.Adam(model.parameters(), lr=0.1)
    _train_step(model, opt, 1)  # Adam's moments and step counts exist: they are saved
    ckpt = HeldCopy(tmp_path, model, opt, comm=LocalCommunicator(), async_save=True)
    expected = _saved_now(model, opt)
    ckpt.gate.clear()
    ckpt.save(1, 0)
    # before: save() copied everything itself (the thread had nothing to copy; AttributeError on ``copying``)
    assert ckpt.store.copying
    assert ckpt.events == []
    opt.zero_grad()
    _backward(model, 2)  # forward (batch norm's statistics change: they were copied in save) and backward
    assert ckpt.events == [] and ckpt.store.copying  # they ran while the copy was held
    timer = _release_after(ckpt, 0.3)
    opt.step()  # changes the parameters and moments in place: must wait for the copy
    ckpt.events.append("step done")
    timer.join()
    assert ckpt.events == ["copy released", "copied model,optimizer", "step done"]
    assert not torch.equal(model[0].weight, expected[0]["0.weight"])  # the step did change them
    assert ckpt.wait() == os.path.join(ckpt.store.root, "ckpt-000000000001")
    assert _same_as_checkpoint(tmp_path, expected)
    ckpt.store.close()


def test_load_state_dict_of_the_model_or_the_optimizer_waits_for_the_copy(tmp_path):
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    _train_step(model, opt, 1)
    other_model, other_opt = copy.deepcopy(model), None
    other_opt = torch.optim.SGD(other_model.parameters(), lr=0.1, momentum=0.9)
    _train_step(other_model, other_opt, 5)
    ckpt = HeldCopy(tmp_path, model, opt, comm=LocalCommunicator(), async_save=True)
    for step, load in ((1, lambda: model.load_state_dict(other_model.state_dict())), (2, None)):
        if load is None:  # the optimizer's turn: its state is loaded in place of the saved one
            load = lambda: opt.load_state_dict(other_opt.state_dict())  # noqa: E731
        expected = _saved_now(model, opt)
        ckpt.gate.clear()
        ckpt.events.clear()
        ckpt.save(step, 0)
        timer = _release_after(ckpt, 0.3)
        load()
        ckpt.events.append("loaded")
        timer.join()
        assert ckpt.events == ["copy released", "copied model,optimizer", "loaded"]
        ckpt.wait()
        assert _same_as_checkpoint(tmp_path, expected)
    assert torch.equal(model[0].weight, other_model[0].weight)  # the loads did happen
    ckpt.store.close()


def test_a_parameter_changed_by_hand_after_wait_copied_is_not_in_the_checkpoint(tmp_path):
    # Changing a parameter in place by other means than the optimizer's step() is documented as not allowed
    # before the copy is done: Checkpointer.wait_copied() is the way (docs/checkpoint-format.md)
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    _train_step(model, opt, 1)
    ckpt = HeldCopy(tmp_path, model, opt, comm=LocalCommunicator(), async_save=True)
    expected = _saved_now(model, opt)
    ckpt.gate.clear()
    ckpt.save(1, 0)
    timer = _release_after(ckpt, 0.3)
    ckpt.wait_copied()  # before: no such method (AttributeError)
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(-3.0)
    timer.join()
    assert ckpt.events == ["copy released", "copied model,optimizer"]
    ckpt.wait()
    assert _same_as_checkpoint(tmp_path, expected)
    ckpt.store.close()


class HandWrittenSGD:
    """An optimizer that is not a ``torch.optim.Optimizer``: nothing hooks its step."""

    def __init__(self, params, lr):
        self.params, self.lr = list(params), lr

    def zero_grad(self):
        for p in self.params:
            p.grad = None

    @torch.no_grad()
    def step(self):
        for p in self.params:
            p.sub_(self.lr * p.grad)

    def state_dict(self):
        return {"state": {}, "lr": self.lr}

    def load_state_dict(self, state):
        self.lr = state["lr"]


def test_an_optimizer_whose_step_cannot_be_hooked_keeps_the_copy_in_save(tmp_path):
    model = _model()
    opt = HandWrittenSGD(model.parameters(), lr=0.5)
    ckpt = HeldCopy(tmp_path, model, opt, comm=LocalCommunicator(), async_save=True)
    expected = _saved_now(model, torch.optim.SGD(model.parameters(), lr=0.5))  # no optimizer tensors
    ckpt.gate.clear()  # would hold a copy made by the write thread: there is none
    ckpt.save(1, 0)
    assert not ckpt.store.copying
    _train_step(model, opt, 3)  # straight away, not gated
    ckpt.gate.set()
    ckpt.wait()
    assert ckpt.events == []
    assert not torch.equal(model[0].weight, expected[0]["0.weight"])
    assert _same_as_checkpoint(tmp_path, expected)
    ckpt.store.close()


def test_steps_straight_after_each_save_leave_every_checkpoint_as_the_state_at_its_save(tmp_path):
    # No gate: the copy races the loop as in training (64 MB of parameters and moments: it takes a while)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(1024, 2048), torch.nn.Linear(2048, 1024))
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    ckpt = Checkpointer(tmp_path, model, opt, keep=1, comm=LocalCommunicator(), async_save=True)
    for step in range(1, 4):
        opt.zero_grad()
        model(torch.randn(4, 1024)).square().mean().backward()
        opt.step()
        expected = _saved_now(model, opt)
        ckpt.save(step, 0)
        for _ in range(2):  # the next steps at once: they wait for the copy, never the write
            opt.zero_grad()
            model(torch.randn(4, 1024)).square().mean().backward()
            opt.step()
        ckpt.wait()
        assert _same_as_checkpoint(tmp_path, expected), f"checkpoint of step {step}"
    ckpt.store.close()


def _nice_of_this_thread():
    with open(f"/proc/self/task/{threading.get_native_id()}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[16])  # field 19 of stat: nice


def test_writer_priority_low_writes_at_nice_19_after_copying_at_training_priority(tmp_path, monkeypatch):
    from hvdkit.core.checkpoint import state

    seen, write_arrays = {}, state.write_arrays

    class Watched(HeldCopy):
        def _copy_into(self, items, old, staging, ready=None):
            if threading.current_thread().name.startswith("hvdkit-ckpt-write"):
                seen["copy"] = _nice_of_this_thread()
            return super()._copy_into(items, old, staging, ready)

    def watched_write(path, items, **how):
        seen["write"] = _nice_of_this_thread()
        return write_arrays(path, items, **how)

    monkeypatch.setattr(state, "write_arrays", watched_write)
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    before = _nice_of_this_thread()
    # before: TypeError (no writer_priority); the priority was a module-wide value
    ckpt = Watched(tmp_path, model, opt, comm=LocalCommunicator(), async_save=True, writer_priority="low")
    ckpt.save(1, 0)
    ckpt.wait()
    assert seen == {"copy": before, "write": 19}
    assert _nice_of_this_thread() == before
    ckpt.store.close()


@pytest.mark.parametrize("priority", ["lowest", 19, None])
def test_a_writer_priority_other_than_the_four_is_a_config_error_naming_them(tmp_path, priority):
    model = _model()
    with pytest.raises(ConfigError, match=r"writer_priority must be one of \['auto', 'idle', 'low', 'normal'\] \(got"):
        Checkpointer(tmp_path / "c", model, comm=LocalCommunicator(), writer_priority=priority)
    assert not (tmp_path / "c").exists()  # refused before the folder was made


@pytest.mark.parametrize(
    ("threads", "local_size", "chosen"),
    [(3, 1, "idle"), (4, 1, "normal"), (1, 4, "normal"), (1, 2, "idle"), (2, 2, "normal")],
)
def test_the_default_writer_priority_is_idle_where_training_leaves_a_core_free_else_normal(
    tmp_path, monkeypatch, caplog, threads, local_size, chosen
):
    """The default, "auto": on a host of 4 cores, torch's threads x the ranks on the host (the launcher's
    variables) below 4 leave a core to the write: "idle" (0.96-0.99x the step there, the write as fast as at
    "normal"); all 4 busy: "normal" ("idle" made the write 2-3x longer and cost more training time in all).
    Before, the default was "normal" everywhere."""
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3})
    for name, value in (("RANK", 0), ("SIZE", local_size), ("LOCAL_RANK", 0), ("LOCAL_SIZE", local_size)):
        monkeypatch.setenv(f"HOROVOD_{name}", str(value))
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        with caplog.at_level("INFO", logger="hvdkit.checkpoint"):
            ckpt = Checkpointer(tmp_path / "c", _model(), comm=LocalCommunicator(), async_save=True)
    finally:
        torch.set_num_threads(before)
    assert ckpt.writer_priority == chosen and ckpt.store._writes.priority == chosen
    assert f"background checkpoint writes at {chosen!r} priority (writer_priority='auto'): {threads} thread(s) x " in (
        caplog.text
    )
    ckpt.store.close()
    asked = Checkpointer(tmp_path / "d", _model(), comm=LocalCommunicator(), async_save=True, writer_priority="low")
    assert asked.writer_priority == "low"  # a priority asked for is kept
    asked.store.close()


def test_auto_writes_at_idle_when_the_model_is_on_an_accelerator_whatever_the_threads(monkeypatch):
    from hvdkit.core.checkpoint.background import choose_writer_priority

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
    assert choose_writer_priority("auto", accelerator=True, threads=2, local_size=1)[0] == "idle"
    assert choose_writer_priority("auto", accelerator=False, threads=2, local_size=1)[0] == "normal"
    assert choose_writer_priority("normal", accelerator=True, threads=1, local_size=1) == ("normal", "as asked")
    with pytest.raises(ConfigError, match=r"writer_priority must be one of \['auto', 'idle', 'low', 'normal'\]"):
        choose_writer_priority("fast", accelerator=False, threads=1, local_size=1)
