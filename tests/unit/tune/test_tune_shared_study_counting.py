"""Two hvdkit tune drivers on one study (one journal file): a trial counts as taken while it runs in
either, so a driver starts nothing once finished + running trials reach --trials, and a trial asked
after others already filled the study is given back unrun (FAIL with the reason), not run as an
extra one. No trial is started here: the drivers only ask Optuna."""

import io

import pytest

from hvdkit.core.errors import ConfigError
from hvdkit.tune.config import TuneConfig
from hvdkit.tune.space import parse_space
from hvdkit.tune.study import Driver

optuna = pytest.importorskip("optuna")


def _driver(tmp_path, name, trials):
    cfg = TuneConfig(
        space=parse_space({"lr": {"type": "float", "low": 0.01, "high": 0.1}}),
        metric="val_loss",
        mode="min",
        trials=trials,
        command=("python", "train.py"),
        storage=str(tmp_path / "study.journal"),
        study_name="shared",
        out=str(tmp_path / name),
    )
    return Driver(cfg, stream=io.StringIO())


def test_a_trial_running_in_another_driver_counts_and_a_late_ask_is_given_back_unrun(tmp_path):
    a, b = _driver(tmp_path, "a", 2), _driver(tmp_path, "b", 2)
    first = a.study.ask()
    assert not a._too_late(first) and a.taken() == 1
    assert b._may_start()  # 1 running (in a) of 2
    second = b.study.ask()
    assert not b._too_late(second)
    assert not a._may_start() and not b._may_start()  # 2 running: the study is full
    a.study.tell(first, 0.5)
    assert a.taken() == b.taken() == 2 and a.done() == 1
    # a third ask (another worker that counted before the second started) is too late: given back, unrun
    third = a.study.ask()
    assert a._too_late(third)
    late = a.study.get_trials()[third.number]
    assert late.state.name == "FAIL"
    assert late.user_attrs["hvdkit_error"] == "not run: 2 trials asked before it already fill the study"
    assert a.taken() == 2 and a.failures == 0  # not counted against --max-failures


def test_a_lower_numbered_trial_that_failed_frees_its_place(tmp_path):
    a, b = _driver(tmp_path, "a", 1), _driver(tmp_path, "b", 1)
    first, second = a.study.ask(), b.study.ask()
    a.study.tell(first, state=optuna.trial.TrialState.FAIL)
    assert not b._too_late(second)  # the only trial ahead of it failed: it may run


@pytest.mark.parametrize("value", [0, -1, True, 1.5])
def test_max_failures_must_be_a_positive_integer(tmp_path, value):
    cfg = TuneConfig(
        space=parse_space({"lr": {"type": "float", "low": 0.01, "high": 0.1}}),
        metric="m",
        mode="min",
        trials=1,
        command=("python", "t.py"),
        max_failures=value,
    )
    with pytest.raises(ConfigError, match=rf"--max-failures must be an integer >= 1 \(got {value!r}\)"):
        cfg.check()
