"""One vocabulary: the adapters' public names are exactly those of the table in docs/api/names.md.

A name added, renamed or removed in ``hvdkit.torch``, ``hvdkit.tensorflow`` or ``hvdkit.keras``
fails here until the table says so; a name the adapters share takes the same arguments; every
deprecated name warns and still works; what is named like a class is a class.
"""

import inspect
import json
import re
import warnings

import pytest
from helpers import PYTHON, ROOT, run_bounded

torch = pytest.importorskip("torch")
pytest.importorskip("tensorflow")
pytest.importorskip("horovod.torch")
pytest.importorskip("horovod.tensorflow")

import hvdkit.core as core  # noqa: E402
import hvdkit.keras as hk_keras  # noqa: E402
import hvdkit.tensorflow as hk_tf  # noqa: E402
import hvdkit.torch as hk_torch  # noqa: E402
from hvdkit.core.lr import scaled_lr as core_scaled_lr  # noqa: E402

ADAPTERS = {"hvdkit.torch": hk_torch, "hvdkit.tensorflow": hk_tf, "hvdkit.keras": hk_keras}
PAGE = ROOT / "docs" / "api" / "names.md"

# Names shared by adapters whose arguments differ by framework; the arguments they share must still agree.
FRAMEWORK_EXTRAS = {
    "DistributedOptimizer": (
        "torch's takes model=, op=, max_grad_norm= (Keras clips inside its own optimizer); "
        "both take shard_optimizer_state= (ZeRO-1)"
    ),
}

# torch's first optimizer step sets TORCHINDUCTOR_CACHE_DIR: take it at import, not inside a test
# (the conftest fails a test that changes the environment).
torch.optim.SGD(torch.nn.Linear(1, 1).parameters(), lr=0.1).step()


def tables():
    """The page's markdown tables: [(header cells, [row cells, ...]), ...]."""
    found, current = [], None
    for line in PAGE.read_text(encoding="utf-8").splitlines():
        if not line.startswith("|"):
            current = None
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if current is None:
            current = (cells, [])
            found.append(current)
        elif not set("".join(cells)) <= set("-: "):
            current[1].append(cells)
    return found


def names_in(cell):
    return set(re.findall(r"`([A-Za-z_][\w.]*)`", cell))


def concept_table():
    """{column header: {row concept: names}} of the table whose first header is "concept"."""
    ((header, rows),) = [t for t in tables() if t[0][0] == "concept"]
    columns = [h.strip("`") for h in header]
    return {col: {row[0]: names_in(row[i]) for row in rows} for i, col in enumerate(columns) if i > 0}


def deprecated_table():
    """[(adapter, old name, new name)] of the table whose first header is "adapter"."""
    ((header, rows),) = [t for t in tables() if t[0][0] == "adapter"]
    assert header[1:3] == ["old name", "new name"]
    return [(row[0].strip("`"), row[1].strip("`"), row[2].strip("`")) for row in rows]


def column(adapter):
    return set().union(*concept_table()[adapter].values())


def deprecated_names(adapter):
    return {old for where, old, _ in deprecated_table() if where == adapter}


@pytest.mark.parametrize("adapter", sorted(ADAPTERS))
def test_each_adapter_exports_exactly_the_current_names_the_table_lists(adapter):
    exported = set(ADAPTERS[adapter].__all__) - deprecated_names(adapter)
    assert sorted(exported - column(adapter)) == [], "exported but not in docs/api/names.md"
    assert sorted(column(adapter) - exported) == [], "in docs/api/names.md but not exported"
    assert len(ADAPTERS[adapter].__all__) == len(set(ADAPTERS[adapter].__all__))


def test_every_deprecated_name_is_still_exported_beside_its_new_name():
    rows = deprecated_table()
    assert len(rows) >= 9
    for adapter, old, new in rows:
        module = ADAPTERS[adapter]
        assert old in module.__all__ and hasattr(module, old)
        assert new in column(adapter) and new in module.__all__


def test_the_core_names_in_the_table_are_public_core_names():
    named = column("hvdkit.core")
    assert {"PreemptionGuard", "Tracker", "StragglerMonitor", "scaled_lr"} <= named
    assert sorted(named - set(core.__all__)) == []


def _shared_names():
    out = {}
    for adapter, module in ADAPTERS.items():
        for name in set(module.__all__) - deprecated_names(adapter):
            if callable(getattr(module, name)):
                out.setdefault(name, []).append(adapter)
    return {name: adapters for name, adapters in out.items() if len(adapters) > 1}


@pytest.mark.parametrize("name", sorted(_shared_names()))
def test_a_name_the_adapters_share_takes_the_same_arguments(name):
    params = {a: inspect.signature(getattr(ADAPTERS[a], name)).parameters for a in _shared_names()[name]}
    first, *others = params.values()
    for other in others:
        if name in FRAMEWORK_EXTRAS:
            common = first.keys() & other.keys()
            assert common, name
            assert {p: first[p].default for p in common} == {p: other[p].default for p in common}
        else:
            assert list(first.values()) == list(other.values())


def test_everything_named_like_a_class_is_a_class():
    for adapter, module in ADAPTERS.items():
        capitalised = [n for n in module.__all__ if n[0].isupper()]
        # DistributedOptimizer mirrors Horovod: a function returning an instance of the optimizer's own class.
        assert [n for n in capitalised if not inspect.isclass(getattr(module, n))] == ["DistributedOptimizer"] * (
            adapter != "hvdkit.tensorflow"
        ), adapter


def test_the_keras_callbacks_end_in_callback_and_nothing_else_does():
    import keras

    for adapter, module in ADAPTERS.items():
        for name in set(module.__all__) - deprecated_names(adapter):
            obj = getattr(module, name)
            is_callback = inspect.isclass(obj) and issubclass(obj, keras.callbacks.Callback)
            assert is_callback == name.endswith("Callback"), f"{adapter}.{name}"


def _warns(fn, *args, **kwargs):
    """fn(*args, **kwargs) and the messages of the DeprecationWarnings it raised."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = fn(*args, **kwargs)
    return result, [str(w.message) for w in caught if issubclass(w.category, DeprecationWarning)]


KERAS_ALIAS_ARGS = {
    "BroadcastInitialState": ((), {"root_rank": 1}, "root_rank", 1),
    "Checkpoint": (("ckpts",), {"keep": 5}, "keep", 5),
    "LearningRateWarmup": ((0.1,), {"warmup_epochs": 2}, "warmup_epochs", 2),
    "MetricAverage": ((), {}, None, None),
    "ProgressBar": ((), {"batch_size": 32}, "batch_size", 32),
    "ScaledSchedule": ((0.1,), {"size": 4, "rule": "sqrt"}, "scale", 2.0),
    "StragglerReport": ((), {"threshold": 1.5}, "threshold", 1.5),
    "TrackMetrics": (("runs",), {}, "tracker", None),
}


@pytest.mark.parametrize("old", sorted(KERAS_ALIAS_ARGS))
def test_each_old_keras_name_warns_and_builds_its_new_class_with_the_same_arguments(old):
    new = {o: n for a, o, n in deprecated_table() if a == "hvdkit.keras"}[old]
    args, kwargs, attr, value = KERAS_ALIAS_ARGS[old]
    obj, messages = _warns(getattr(hk_keras, old), *args, **kwargs)
    note = " (restore() returns a Resumed or None)" if old == "Checkpoint" else ""
    removed = "is deprecated and will be removed in hvdkit 0.3"
    assert messages == [f"hvdkit.keras.{old} {removed}; use hvdkit.keras.{new}{note} instead"]
    assert isinstance(obj, getattr(hk_keras, new))
    if attr is not None:
        assert getattr(obj, attr) == value
    assert inspect.signature(getattr(hk_keras, old)) == inspect.signature(getattr(hk_keras, new))


def test_every_deprecated_keras_name_is_tested_above():
    assert set(KERAS_ALIAS_ARGS) == deprecated_names("hvdkit.keras")


def test_an_old_scaled_schedule_still_scales_and_serialises_under_its_old_name():
    import keras

    old, _ = _warns(hk_keras.ScaledSchedule, 0.1, "linear", warmup_steps=0, size=2)
    assert float(old(0)) == pytest.approx(0.2)
    config = keras.saving.serialize_keras_object(old)
    assert config["registered_name"] == "hvdkit>ScaledSchedule"
    again, messages = _warns(keras.saving.deserialize_keras_object, config)
    assert type(again) is hk_keras.ScaledSchedule and float(again(0)) == pytest.approx(0.2) and messages


def test_torch_scale_lr_warns_and_returns_the_scaled_lr_scheduler():
    opt = torch.optim.SGD(torch.nn.Linear(2, 1).parameters(), lr=0.1)
    sched, messages = _warns(hk_torch.scale_lr, opt, "linear", warmup_steps=2, size=4)
    assert messages == [
        "hvdkit.torch.scale_lr is deprecated and will be removed in hvdkit 0.3; "
        "use hvdkit.torch.ScaledLRScheduler instead"
    ]
    assert isinstance(sched, hk_torch.ScaledLRScheduler)
    rates = []
    for _ in range(4):
        rates.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    assert rates == pytest.approx([0.1, 0.25, 0.4, 0.4])


def test_the_old_argument_order_of_core_scaled_lr_warns_and_gives_the_same_rate():
    assert core_scaled_lr(0.1, "sqrt", size=4) == pytest.approx(0.2)
    rate, messages = _warns(core_scaled_lr, 0.1, 4, "sqrt")
    assert rate == pytest.approx(0.2) and len(messages) == 1 and "scaled_lr(base_lr, size, rule)" in messages[0]
    rate, messages = _warns(core_scaled_lr, 0.1, 4)
    assert rate == pytest.approx(0.4) and len(messages) == 1


def test_the_samplers_take_rank_and_size_and_their_old_keywords_warn():
    data = list(range(7))
    assert list(hk_torch.EvalSampler(data, size=3, rank=1)) == [1, 4]
    sampler, messages = _warns(hk_torch.EvalSampler, data, num_replicas=3, rank_=1)
    assert list(sampler) == [1, 4]
    assert messages == [
        "EvalSampler(num_replicas=) is deprecated and will be removed in hvdkit 0.3; use size= instead",
        "EvalSampler(rank_=) is deprecated and will be removed in hvdkit 0.3; use rank= instead",
    ]
    new = hk_torch.TrainSampler(8, 2, shuffle=False, rank=1, size=2)
    old, messages = _warns(hk_torch.TrainSampler, 8, 2, shuffle=False, rank_=1, size_=2)
    assert [list(b) for b in old] == [list(b) for b in new] == [[1, 3], [5, 7]]
    assert len(messages) == 2
    with pytest.raises(core.ConfigError, match=r"EvalSampler\(rank_=\) and rank= are the same argument"):
        hk_torch.EvalSampler(data, rank=0, rank_=1)


_TORCH_CLASSES = """
import json, sys, warnings
import hvdkit.core as core, hvdkit.torch as hk
from hvdkit.core.tracking import tracker_for
hk.init()
guard, monitor = hk.PreemptionGuard(every=3), hk.StragglerMonitor(threshold=1.5, name="t")
tracker = hk.Tracker(sys.argv[1], params={"lr": 0.1})
tracker.close()
guard.close()
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    old = tracker_for(hk.communicator)(sys.argv[1] + "/old")
old.close()
print(json.dumps({
    "guard": [isinstance(guard, hk.PreemptionGuard), isinstance(guard, core.PreemptionGuard), guard.every],
    "monitor": [isinstance(monitor, hk.StragglerMonitor), isinstance(monitor, core.StragglerMonitor),
                monitor.threshold],
    "tracker": [isinstance(tracker, hk.Tracker), isinstance(tracker, core.Tracker), tracker.params["lr"], tracker.size],
    "tracker_for": [type(old).__name__, [str(w.message)[:40] for w in caught]],
}))
"""


def test_the_torch_preemption_guard_straggler_monitor_and_tracker_are_classes(tmp_path):
    proc = run_bounded([PYTHON, "-c", _TORCH_CLASSES, str(tmp_path)], timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got == {
        "guard": [True, True, 3],
        "monitor": [True, True, 1.5],
        "tracker": [True, True, 0.1, 1],
        "tracker_for": ["Tracker", ["hvdkit.core.tracking.tracker_for is depr"]],
    }


_KERAS_CHECKPOINTS = """
import json, sys, warnings
import numpy as np, keras
import hvdkit.core as core, hvdkit.keras as hk, hvdkit.tensorflow as htf
hk.init()
guard, tracker = htf.PreemptionGuard(every=2), hk.Tracker(sys.argv[1] + "/runs")
tracker.close()
guard.close()
keras.utils.set_random_seed(0)
model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
model.compile(optimizer=hk.DistributedOptimizer(keras.optimizers.SGD(0.1)), loss="mse")
fresh = hk.CheckpointCallback(sys.argv[1] + "/ckpt", model).restore()
model.fit(np.ones((4, 2)), np.ones((4, 1)), epochs=2, verbose=0,
          callbacks=[hk.CheckpointCallback(sys.argv[1] + "/ckpt", model)])
new = hk.CheckpointCallback(sys.argv[1] + "/ckpt", model)
resumed = new.restore()
with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    old = hk.Checkpoint(sys.argv[1] + "/ckpt", model).restore()
print(json.dumps({
    "classes": [isinstance(guard, core.PreemptionGuard), guard.every, isinstance(tracker, core.Tracker),
                hk.Tracker is htf.Tracker, hk.PreemptionGuard is htf.PreemptionGuard],
    "fresh": fresh,
    "resumed": [type(resumed).__name__, isinstance(resumed, hk.Resumed), resumed.epoch, new.initial_epoch],
    "old": [type(old).__name__, old],
}))
"""


def test_keras_checkpoint_callback_restores_a_resumed_and_the_old_name_an_epoch(tmp_path):
    proc = run_bounded([PYTHON, "-c", _KERAS_CHECKPOINTS, str(tmp_path)], timeout=180)
    assert proc.returncode == 0, proc.stderr[-2000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got == {
        "classes": [True, 2, True, True, True],
        "fresh": None,
        "resumed": ["Resumed", True, 2, 2],
        "old": ["int", 2],
    }
