"""hvdkit tune's results from a real Optuna study: the table, trials.csv, best.json and the PNG plots say
exactly what the study holds (values, states, params, attempts, the first line of an error)."""

import csv
import datetime
import json

import pytest

from hvdkit.tune.results import (
    ATTEMPT_ATTR,
    ERROR_ATTR,
    KEY_ATTR,
    format_table,
    rows_of,
    write_best,
    write_csv,
    write_plots,
)

optuna = pytest.importorskip("optuna")
# Optuna's importances import scikit-learn, which sets KMP_* variables: at import, not inside a test
# (the conftest fails a test that changes the environment).
pytest.importorskip("optuna.importance")
D = optuna.distributions
T0 = datetime.datetime(2026, 11, 26, 12, 0, 0)


def _trial(number, state, value, lr, bs, seconds, attempt=1, key=None, error=None, steps=None):
    attrs = {ATTEMPT_ATTR: attempt, KEY_ATTR: number if key is None else key}
    if error:
        attrs[ERROR_ATTR] = error
    return optuna.trial.create_trial(
        state=state,
        value=value,
        params={"lr": lr, "batch-size": bs},
        distributions={
            "lr": D.FloatDistribution(1e-3, 0.3, log=True),
            "batch-size": D.CategoricalDistribution([16, 64]),
        },
        user_attrs=attrs,
        intermediate_values=steps or {},
    )


@pytest.fixture
def study():
    S = optuna.trial.TrialState
    s = optuna.create_study(study_name="demo", direction="minimize")
    s.add_trial(_trial(0, S.COMPLETE, 0.4, 0.01, 16, 10, steps={0: 1.0, 1: 0.4}))
    s.add_trial(_trial(1, S.FAIL, None, 0.2, 64, 2, error="exit code 3; last output:\ninjected failure"))
    s.add_trial(_trial(2, S.COMPLETE, 0.3, 0.2, 64, 9, attempt=2, key=1, steps={0: 0.9, 1: 0.3}))
    s.add_trial(_trial(3, S.PRUNED, None, 0.001, 16, 4, steps={0: 2.3}))
    return s


def test_rows_carry_state_value_params_attempt_and_the_error(study):
    rows = rows_of(study.get_trials(), ["lr", "batch-size"])
    got = [
        (r["number"], r["state"], r["value"], r["lr"], r["batch-size"], r["attempt"], r["key"], r["error"])
        for r in rows
    ]
    assert got == [
        (0, "COMPLETE", 0.4, 0.01, 16, 1, 0, ""),
        (1, "FAIL", None, 0.2, 64, 1, 1, "exit code 3; last output:\ninjected failure"),
        (2, "COMPLETE", 0.3, 0.2, 64, 2, 1, ""),
        (3, "PRUNED", 2.3, 0.001, 16, 1, 3, ""),  # a pruned trial shows its last reported value
    ]
    table = format_table(rows, ["lr", "batch-size"], "val_loss").splitlines()
    assert table[0].split() == ["#", "lr", "batch-size", "val_loss", "state", "seconds"]
    assert table[2].split()[:5] == ["0", "0.01", "16", "0.4", "COMPLETE"]
    assert table[3].split()[:5] == ["1", "0.2", "64", "-", "FAIL"]
    assert len(table) == 6


def test_csv_and_best_json_hold_the_study(tmp_path, study):
    rows = rows_of(study.get_trials(), ["lr", "batch-size"])
    write_csv(str(tmp_path / "trials.csv"), rows, ["lr", "batch-size"])
    with open(tmp_path / "trials.csv", newline="") as f:
        back = list(csv.DictReader(f))
    assert [r["state"] for r in back] == ["COMPLETE", "FAIL", "COMPLETE", "PRUNED"]
    assert back[1]["value"] == "" and back[1]["error"] == "exit code 3; last output:\ninjected failure"
    assert float(back[2]["value"]) == 0.3 and back[2]["attempt"] == "2" and back[2]["key"] == "1"
    best = write_best(str(tmp_path / "best.json"), study, "val_loss", "min")
    on_disk = json.loads((tmp_path / "best.json").read_text())
    assert (
        best
        == on_disk
        == {
            "study": "demo",
            "metric": "val_loss",
            "mode": "min",
            "number": 2,
            "value": 0.3,
            "params": {"lr": 0.2, "batch-size": 64},
        }
    )
    assert write_best(str(tmp_path / "best-max.json"), study, "val_loss", "max")["number"] == 0


def test_no_complete_trial_writes_no_best_json(tmp_path):
    s = optuna.create_study()
    assert write_best(str(tmp_path / "best.json"), s, "m", "min") is None
    assert not (tmp_path / "best.json").exists()


def test_the_summary_names_only_the_files_written_when_no_trial_is_complete(tmp_path):
    import io
    import types
    import warnings

    from hvdkit.tune.results import write_results

    S = optuna.trial.TrialState
    s = optuna.create_study(study_name="demo", direction="minimize")
    s.add_trial(_trial(0, S.FAIL, None, 0.2, 64, 2, error="exit code 3"))
    cfg = types.SimpleNamespace(space=types.SimpleNamespace(names=lambda: ["lr", "batch-size"]))
    cfg.out, cfg.metric, cfg.mode = str(tmp_path), "val_loss", "min"
    stream = io.StringIO()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # e.g. matplotlib's 'No artists with labels found to put in legend'
        write_results(s, cfg, stream)
    said = stream.getvalue()
    assert not (tmp_path / "best.json").exists()
    assert "no trial is complete yet: no best.json" in said
    assert said.splitlines()[-1] == f"wrote {tmp_path / 'trials.csv'}, history.png"


def test_the_plots_are_png_files(tmp_path, study):
    paths = write_plots(str(tmp_path), study, "val_loss", "min")
    assert [p.rsplit("/", 1)[1] for p in paths] == ["history.png", "importance.png"]
    for p in paths:
        with open(p, "rb") as f:
            assert f.read(8) == b"\x89PNG\r\n\x1a\n"
