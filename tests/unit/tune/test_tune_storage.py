"""Where hvdkit tune keeps a study (a journal file in --out by default, an RDB URL or a journal path with
--storage; a second open finds the same trials) and how its pruners decide."""

import pytest

from hvdkit.core.errors import ConfigError
from hvdkit.tune.storage import describe_storage, make_pruner, open_storage

optuna = pytest.importorskip("optuna")


def _one_complete_trial(storage):
    s = optuna.create_study(storage=storage, study_name="s", load_if_exists=True)
    s.tell(s.ask(), 1.5)
    return s


@pytest.mark.parametrize("kind", ["default", "journal", "sqlite"])
def test_a_study_written_once_is_found_again_by_the_next_open(tmp_path, kind):
    given = {"default": None, "journal": str(tmp_path / "j.log"), "sqlite": f"sqlite:///{tmp_path}/s.db"}[kind]
    _one_complete_trial(open_storage(given, str(tmp_path)))
    again = optuna.load_study(storage=open_storage(given, str(tmp_path)), study_name="s")
    assert [t.value for t in again.get_trials()] == [1.5]
    expected = {"default": tmp_path / "study.journal", "journal": tmp_path / "j.log", "sqlite": tmp_path / "s.db"}[kind]
    assert expected.is_file()
    assert describe_storage(given, str(tmp_path)).startswith(
        "database sqlite://" if kind == "sqlite" else "journal file"
    )


def test_a_journal_in_a_missing_folder_is_an_error_naming_it(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        open_storage(str(tmp_path / "nope" / "j.log"), str(tmp_path))


def test_the_median_pruner_waits_for_its_startup_trials_and_warmup_epochs():
    study = optuna.create_study(pruner=make_pruner("median", 1, 1))
    good = study.ask()
    for epoch, value in enumerate([1.0, 0.5]):
        good.report(value, epoch)
    study.tell(good, 0.5)
    bad = study.ask()
    bad.report(2.0, 0)
    assert not bad.should_prune()  # epoch 0 is warmup
    bad.report(2.0, 1)
    assert bad.should_prune()
    none = optuna.create_study(pruner=make_pruner("none", 0))
    t = none.ask()
    t.report(1e9, 0)
    assert not t.should_prune()
    with pytest.raises(ConfigError, match="--pruner must be one of median, asha, none"):
        make_pruner("hyperband", 0)
