"""One ZeRO contract: the torch and Keras sharded optimizers both satisfy ``hvdkit.core.zero.ShardedState``.

A checkpointer tells a sharded optimizer apart by ``isinstance(opt, ShardedState)``, whichever the
framework, so both must offer its calls under its names, and the old names (torch's
``consolidate_state_dict``/``state_dict``/``load_state_dict``, Keras's ``consolidated_variables``)
must still give the same state. Checked on the classes and on real optimizers built on one rank (each
framework in a process of its own: ``hk.init()`` there, not in the test process). Both sides must cut
and pack with the core's arithmetic, not copies of it.
"""

import inspect
import json

import pytest
from helpers import PYTHON, run_bounded

from hvdkit.core import zero as core_zero
from hvdkit.core.zero import ShardedState

pytest.importorskip("horovod.torch")
pytest.importorskip("horovod.tensorflow")

# imported at collection, not inside a test: importing TensorFlow sets TF_CPP_MIN_LOG_LEVEL (the
# conftest fails a test that changes the environment)
from hvdkit.keras import zero as keras_zero  # noqa: E402
from hvdkit.keras import zero_rounds  # noqa: E402
from hvdkit.keras.loss_scale import ShardedLossScaleMixin  # noqa: E402
from hvdkit.torch import zero as torch_zero  # noqa: E402


def _members():
    return [name for name, value in vars(ShardedState).items() if callable(value) and not name.startswith("_")]


def test_the_contract_names_two_calls():
    assert sorted(_members()) == ["consolidate", "load_unsharded"]
    assert inspect.signature(ShardedState.consolidate).parameters["to"].default == 0


def test_both_frameworks_sharded_optimizer_classes_offer_every_call_of_the_contract():
    for cls in [torch_zero.ShardedOptimizer, keras_zero.ShardedMixin, ShardedLossScaleMixin]:
        for name in _members():
            method = getattr(cls, name)
            assert callable(method), (cls, name)
            params = list(inspect.signature(method).parameters.values())[1:]  # after self
            assert len(params) == 1, (cls, name)
        assert inspect.signature(cls.consolidate).parameters["to"].default == 0, cls


def test_torch_and_keras_use_the_core_arithmetic_itself():
    assert keras_zero.ShardedMixin.round_elements == core_zero.ROUND_ELEMENTS
    assert zero_rounds.ROUND_ELEMENTS is core_zero.ROUND_ELEMENTS and zero_rounds.rank_parts is core_zero.rank_parts
    assert torch_zero.ROUND_ELEMENTS is core_zero.ROUND_ELEMENTS
    assert torch_zero.CHUNK_ELEMENTS is core_zero.CHUNK_ELEMENTS
    assert torch_zero.partition is core_zero.partition and keras_zero.partition is core_zero.partition


_TORCH = """
import json, torch
import hvdkit.torch as hk
from hvdkit.core.zero import ShardedState
hk.init()
torch.manual_seed(0)
model = torch.nn.Linear(3, 2)
opt = hk.DistributedOptimizer(torch.optim.Adam(model.parameters(), lr=0.1), shard_optimizer_state=True)
plain = hk.DistributedOptimizer(torch.optim.SGD(torch.nn.Linear(1, 1).parameters(), lr=0.1))
model(torch.ones(4, 3)).sum().backward()
opt.step()
state = opt.consolidate(to=0)
same = state["state"][0]["exp_avg"].tolist() == opt.state_dict()["state"][0]["exp_avg"].tolist()
saved = {"state": {k: {n: v.clone() for n, v in s.items()} for k, s in state["state"].items()},
         "param_groups": state["param_groups"]}
opt.zero_grad()
model(torch.ones(4, 3)).sum().backward()
opt.step()
opt.load_unsharded(saved)
print(json.dumps({
    "sharded": isinstance(opt, ShardedState), "plain": isinstance(plain, ShardedState),
    "same": same, "steps": float(state["state"][0]["step"]),
    "exp_avg": state["state"][1]["exp_avg"].tolist(),
    "reloaded": opt.state_dict()["state"][1]["exp_avg"].tolist(),
}))
"""

_KERAS = """
import json
import numpy as np, keras
import hvdkit.keras as hk
from hvdkit.core.zero import ShardedState
hk.init()
def built(opt):
    v = keras.Variable(np.arange(3, dtype="float32"))
    opt.build([v])
    opt.apply([keras.ops.ones((3,))], [v])
    return opt
opt = built(hk.DistributedOptimizer(keras.optimizers.Adam(0.1), shard_optimizer_state=True))
scaled = built(hk.DistributedOptimizer(keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(0.1)),
                                       shard_optimizer_state=True))
plain = hk.DistributedOptimizer(keras.optimizers.Adam(0.1))
state = opt.consolidate(to=0)
old = opt.consolidated_variables(to=0)
opt.load_unsharded([np.zeros_like(a) + 7 for a in state])
print(json.dumps({
    "sharded": isinstance(opt, ShardedState), "scaled_is": isinstance(scaled, ShardedState),
    "plain": isinstance(plain, ShardedState),
    "same": [a.tolist() for a in state] == [a.tolist() for a in old],
    "count": len(state), "scaled": [np.ravel(a).tolist() for a in scaled.consolidate(to=None)],
    "reloaded": [np.ravel(a).tolist() for a in opt.consolidate(to=0)],
}))
"""


def _run(script):
    proc = run_bounded([PYTHON, "-c", script], timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_a_torch_sharded_optimizer_is_a_sharded_state_whose_calls_match_the_torch_names():
    got = _run(_TORCH)
    assert got["sharded"] is True and got["plain"] is False
    assert got["same"] is True and got["steps"] == 1.0
    # Adam's first moment after one step: (1 - beta1) * gradient; the bias's gradient is 4 (4 samples)
    assert got["exp_avg"] == pytest.approx([0.4, 0.4])
    assert got["reloaded"] == got["exp_avg"]  # the second step undone by loading the saved state


def test_keras_sharded_optimizers_are_sharded_states_whose_calls_match_the_keras_names():
    got = _run(_KERAS)
    assert got["sharded"] is True and got["scaled_is"] is True and got["plain"] is False
    assert got["same"] is True
    assert got["count"] == 4  # Adam: iteration, learning rate, momentum and velocity of the one variable
    # the loss-scale optimizer's own variables (iteration, learning rate, step counter, scale), then SGD's 2
    assert got["scaled"] == [[0], [0.0], [1], [32768.0], [1], [pytest.approx(0.1)]]
    assert got["reloaded"] == [[7.0]] * 2 + [[7.0] * 3] * 2


def test_the_torch_optimizer_is_split_into_its_state_and_its_step_importing_one_way():
    from hvdkit.torch import zero_state

    assert issubclass(torch_zero.ShardedOptimizer, zero_state.ShardedOptimizerState)
    state_calls = {"consolidate", "consolidate_state_dict", "load_state_dict", "load_unsharded", "share_state"}
    state_calls |= {"state_dict"}
    assert state_calls <= set(vars(zero_state.ShardedOptimizerState))
    assert state_calls.isdisjoint(vars(torch_zero.ShardedOptimizer))  # the step does not redefine them
    assert {"step", "amp_step", "zero_grad"} <= set(vars(torch_zero.ShardedOptimizer))
    source = open(zero_state.__file__).read()
    assert "from .zero import" not in source and "import zero\n" not in source  # zero imports zero_state only


def test_the_overlap_rounds_use_only_public_documented_members_of_the_optimizer():
    import ast

    from hvdkit.torch import zero_overlap

    tree = ast.parse(open(zero_overlap.__file__).read())
    used = {
        node.attr
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "optimizer"
    }
    assert {"flat_groups", "round_plan", "start_round", "finish_round", "drop_round", "early_rounds"} <= used
    assert sorted(a for a in used if a.startswith("_")) == []
    for name in used:
        member = getattr(torch_zero.ShardedOptimizer, name, None)
        if callable(member) or isinstance(member, property):
            assert inspect.getdoc(member), name


def test_both_checkpointers_know_a_sharded_optimizer_by_the_contract_alone():
    from hvdkit.tensorflow import checkpoint as tf_checkpoint
    from hvdkit.torch import checkpoint as torch_checkpoint

    for module in (torch_checkpoint, tf_checkpoint):
        source = open(module.__file__).read()
        assert module.ShardedState is ShardedState
        assert "isinstance(self.optimizer, ShardedState)" in source
        assert "consolidated_variables" not in source and 'consolidate_state_dict"' not in source


def test_the_docs_map_the_contract_to_each_frameworks_names():
    from helpers import ROOT

    names = (ROOT / "docs" / "api" / "names.md").read_text()
    section = names[names.index("## ZeRO-1: one contract") :]
    for name in [*_members(), "consolidate_state_dict", "consolidated_variables", "load_state_dict", "share_state"]:
        assert f"`{name}(" in section, name
    architecture = (ROOT / "docs" / "architecture.md").read_text()
    assert "## One sharded step (ZeRO-1)" in architecture and "| ZeRO-1 (" in architecture
