"""hvdkit tune --seed S on a study that already has trials (a run resumed after Ctrl-C, or a worker that
joins later) must not draw the parameters of its first trials again: the sampler is seeded from S and
the number of trials in the study, so a fresh study draws what TPESampler(seed=S) draws, a resumed one
draws new parameters, and two runs resumed from the same study draw the same (still repeatable). No
trial is started here: the drivers only ask Optuna, as they do before a trial starts."""

import io
import shutil

import pytest

from hvdkit.tune.config import TuneConfig
from hvdkit.tune.space import parse_space
from hvdkit.tune.study import Driver

optuna = pytest.importorskip("optuna")
SPACE = {
    "lr": {"type": "float", "low": 0.001, "high": 0.1, "log": True},
    "width": {"type": "int", "low": 8, "high": 512},
}


def _driver(journal, out, seed=0):
    cfg = TuneConfig(
        space=parse_space(SPACE),
        metric="val_loss",
        mode="min",
        trials=10,
        command=("python", "train.py"),
        storage=str(journal),
        out=str(out),
        seed=seed,
    )
    return Driver(cfg, stream=io.StringIO())


def _run(driver, trials):
    """The parameters of ``trials`` trials asked and told as a run of ``driver`` would (value 1.0)."""
    drawn = []
    for _ in range(trials):
        trial = driver.study.ask()
        drawn.append(driver.cfg.space.suggest(trial))
        driver.study.tell(trial, 1.0)
    return drawn


def test_a_resumed_seeded_study_draws_new_parameters_and_repeatably(tmp_path):
    journal = tmp_path / "study.journal"
    first = _run(_driver(journal, tmp_path / "a"), 2)
    plain = optuna.create_study(sampler=optuna.samplers.TPESampler(seed=0))
    assert first == _run(_driver(tmp_path / "fresh.journal", tmp_path / "f"), 2)  # seeded: repeatable
    assert first[0] == parse_space(SPACE).suggest(plain.ask())  # a fresh study: what TPESampler(seed=0) draws
    shutil.copy(journal, tmp_path / "copy.journal")
    resumed = _run(_driver(journal, tmp_path / "b"), 2)
    assert len({tuple(p.items()) for p in first + resumed}) == 4, (first, resumed)
    assert _run(_driver(tmp_path / "copy.journal", tmp_path / "c"), 2) == resumed  # same study, same draws
