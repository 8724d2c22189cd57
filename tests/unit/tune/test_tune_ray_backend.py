"""hvdkit tune --backend ray without a cluster: the missing-Ray error, the pruner -> scheduler mapping,
a trial's placement group, the trial folders' numbering, the searcher's space (Ray pickles it), and
the results of what Ray ran in the local backend's format."""

import csv
import io
import json
import pickle
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("ray.tune")
optuna = pytest.importorskip("optuna")

from hvdkit.core.errors import ConfigError, MissingDependencyError  # noqa: E402
from hvdkit.tune.config import TuneConfig  # noqa: E402
from hvdkit.tune.ray_backend import (  # noqa: E402
    DefineByRun,
    RayStudy,
    import_ray,
    scheduler_for,
    trial_resources,
)
from hvdkit.tune.ray_trial import TrialRecord, known_key, trial_key  # noqa: E402
from hvdkit.tune.results import write_results  # noqa: E402
from hvdkit.tune.space import parse_space  # noqa: E402

SPACE = parse_space(
    {"lr": {"type": "float", "low": 1e-3, "high": 0.5, "log": True}, "bs": {"type": "categorical", "choices": [16, 32]}}
)


def _cfg(tmp_path, **kw):
    base = dict(space=SPACE, metric="val_loss", mode="min", trials=3, command=("python", "t.py"), out=str(tmp_path))
    return TuneConfig(**{**base, **kw})


def test_without_ray_the_error_names_the_extra_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray raises ImportError
    with pytest.raises(MissingDependencyError) as e:
        import_ray()
    assert "pip install 'hvdkit[ray]'" in str(e.value) and "--backend ray" in str(e.value)


def test_pruners_map_to_rays_schedulers(tmp_path):
    from ray.tune.schedulers import ASHAScheduler, FIFOScheduler, MedianStoppingRule

    assert isinstance(scheduler_for(_cfg(tmp_path, pruner="median")), MedianStoppingRule)
    assert type(scheduler_for(_cfg(tmp_path, pruner="asha"))) is ASHAScheduler
    assert type(scheduler_for(_cfg(tmp_path, pruner="none"))) is FIFOScheduler


def test_a_trial_is_one_bundle_of_k_cpus_and_k_gpus_only_where_the_cluster_has_gpus():
    assert trial_resources(2, {"CPU": 16.0}) == [{"CPU": 2.0}]
    assert trial_resources(4, {"CPU": 64.0, "GPU": 8.0}) == [{"CPU": 4.0, "GPU": 4.0}]


def test_ray_address_without_the_ray_backend_and_storage_with_it_are_errors(tmp_path):
    with pytest.raises(ConfigError, match="--ray-address '10.0.0.1:6379' needs --backend ray"):
        _cfg(tmp_path, ray_address="10.0.0.1:6379").check()
    _cfg(tmp_path, backend="local").check()
    _cfg(tmp_path, backend="ray", ray_address="10.0.0.1:6379").check()
    with pytest.raises(ConfigError, match="--storage 'x.journal' is for the local backend"):
        _cfg(tmp_path, backend="ray", storage="x.journal").check()


def test_the_parsed_flags_become_the_config_that_picks_the_backend(tmp_path):
    from hvdkit import cli
    from hvdkit.cli.tune import config_from_args

    space, script = tmp_path / "space.yaml", tmp_path / "t.py"
    space.write_text("lr: {type: float, low: 0.001, high: 0.5, log: true}\n")
    script.write_text("pass\n")
    words = ["tune", "--space", str(space), "--metric", "val_loss", "--mode", "min", "--trials", "3"]
    local = config_from_args(cli._parser().parse_args([*words, "--", "python", str(script)]))
    assert (local.backend, local.ray_address, local.command) == ("local", None, ("python", str(script)))
    assert (local.trials, local.space.names()) == (3, ["lr"])
    flags = ["--backend", "ray", "--ray-address", "h:6379", "--", "python", str(script)]
    ray = config_from_args(cli._parser().parse_args([*words, *flags]))
    assert (ray.backend, ray.ray_address, ray.storage) == ("ray", "h:6379", None)


@settings(max_examples=30, deadline=None)
@given(st.lists(st.sampled_from(["a1", "b2", "c3", "d4"]), min_size=1, max_size=12), st.integers(0, 3))
def test_trial_folders_are_numbered_in_order_of_first_start_and_found_again(tmp_path_factory, ids, taken):
    out = tmp_path_factory.mktemp("study")
    for k in range(taken):  # folders already there (another worker's, an earlier run's) are skipped
        (out / "trials" / f"{k:04d}").mkdir(parents=True)
    first = list(dict.fromkeys(ids))
    keys = [trial_key(str(out), i) for i in ids]
    assert keys == [taken + first.index(i) for i in ids]
    assert all(known_key(str(out), i) == taken + first.index(i) for i in first)
    assert known_key(str(out), "never-started") is None


def test_the_searchers_space_survives_pickling_and_suggests_the_spaces_values():
    back = pickle.loads(pickle.dumps(DefineByRun(SPACE)))
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=1))
    trial = study.ask()
    back(trial)
    assert set(trial.params) == {"lr", "bs"} and 1e-3 <= trial.params["lr"] <= 0.5 and trial.params["bs"] in (16, 32)


def test_what_ray_ran_is_written_as_the_local_backends_results(tmp_path):
    cfg = _cfg(tmp_path)
    records = {
        "x": TrialRecord("x", {"lr": 0.01, "bs": 16}, key=1, started=100.0, ended=110.0, state="COMPLETE"),
        "y": TrialRecord("y", {"lr": 0.3, "bs": 32}, key=0, started=100.0, ended=104.5, state="PRUNED"),
        "z": TrialRecord("z", {"lr": 0.002, "bs": 16}, key=2, started=101.0, ended=102.0, state="FAIL"),
    }
    records["x"].epochs = {0: 0.9, 1: 0.4}
    records["y"].epochs = {0: 2.2}
    study = RayStudy(cfg, "ray://nowhere", io.StringIO())._results_study(records, {"z": "exit code 3"})
    stream = io.StringIO()
    write_results(study, cfg, stream)
    with open(tmp_path / "trials.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert [(r["key"], r["state"], r["value"], r["lr"], r["duration_s"]) for r in rows] == [
        ("0", "PRUNED", "2.2", "0.3", "4.5"),
        ("1", "COMPLETE", "0.4", "0.01", "10.0"),
        ("2", "FAIL", "", "0.002", "1.0"),
    ]
    assert rows[2]["error"] == "exit code 3"
    best = json.loads((tmp_path / "best.json").read_text())
    assert (best["value"], best["params"]) == (0.4, {"lr": 0.01, "bs": 16})
    assert "best: trial 1 val_loss 0.4" in stream.getvalue()
