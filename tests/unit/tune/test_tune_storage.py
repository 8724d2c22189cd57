"""Where hvdkit tune keeps a study (a journal file in --out by default, an RDB URL or a journal path with
--storage; a second open finds the same trials) and how its pruners decide."""

import os

import pytest

from hvdkit.core.errors import ConfigError
from hvdkit.tune.storage import make_pruner, open_storage

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


def test_an_rdb_url_whose_driver_is_missing_names_the_driver_and_the_usual_one():
    from hvdkit.core.errors import MissingDependencyError

    with pytest.raises(MissingDependencyError) as e:
        open_storage("postgresql+pg8000://u:secret@127.0.0.1:1/db", "/nonexistent")
    msg = str(e.value)
    assert "'pg8000' is not installed" in msg and "postgresql+psycopg2:// with pip install psycopg2-binary" in msg
    assert "secret" not in msg and "u:***@127.0.0.1" in msg


@pytest.mark.parametrize(
    "url, cause",
    [
        ("nosuchdb://x", "NoSuchModuleError"),
        ("postgresql+psycopg2://h:notaport/db", "ValueError"),
        ("sqlite:////nonexistent-dir/s.db", "OperationalError"),
    ],
)
def test_a_bad_rdb_url_is_a_config_error_naming_it_and_what_to_check(url, cause):
    with pytest.raises(ConfigError) as e:
        open_storage(url, "/nonexistent")
    msg = str(e.value)
    assert msg.startswith(f"--storage {url!r} cannot be opened: {cause}")
    assert "dialect+driver://user:password@host:port/database" in msg


def test_a_password_in_a_storage_url_is_never_shown():
    from hvdkit.tune.storage import shown_url

    assert shown_url("postgresql+psycopg2://me:p@ss:w0rd@db:5432/s") == "postgresql+psycopg2://me:***@db:5432/s"
    assert shown_url("postgresql://me@db/s") == "postgresql://me@db/s"
    assert shown_url("sqlite:///a:b@c.db") == "sqlite:///a:b@c.db"
    assert shown_url("postgresql://me:pa/ss@db/s") == "postgresql://me:***@db/s"
    assert shown_url("postgresql+pg8000://u:a@b@h/d") == "postgresql+pg8000://u:***@h/d"  # SQLAlchemy: host 'b@h'


@pytest.mark.parametrize(
    "url, error",
    [
        ("postgresql://user:pa/ss@127.0.0.1:1/db", "MissingDependencyError"),  # psycopg2 is not installed
        ("nosuchdb://user:pa/ss@127.0.0.1:1/db", "ConfigError"),  # SQLAlchemy knows no such dialect
    ],
)
def test_a_password_with_a_slash_is_masked_in_storage_errors(url, error):
    from hvdkit.core.errors import HvdkitError

    with pytest.raises(HvdkitError) as e:
        open_storage(url, "/nonexistent")
    msg = str(e.value)
    assert type(e.value).__name__ == error
    assert "pa/ss" not in msg and "user:***@127.0.0.1:1/db" in msg


def test_a_url_sqlalchemy_cannot_parse_shows_no_piece_of_its_password():
    # SQLAlchemy splits at the first @: its own message quotes the rest ('w0rd@db:5432') as a bad port
    url = "postgresql+psycopg2://me:p@ss:w0rd@db:5432/s"
    with pytest.raises(ConfigError) as e:
        open_storage(url, "/nonexistent")
    msg = str(e.value)
    assert "w0rd" not in msg and "p@ss" not in msg
    assert msg.startswith("--storage 'postgresql+psycopg2://me:***@db:5432/s' cannot be opened: ValueError: ")
    assert "percent-encoded" in msg


def _journal_of_two_trials(tmp_path):
    path = tmp_path / "j.log"
    s = optuna.create_study(storage=open_storage(str(path), str(tmp_path)), study_name="s")
    for value in (1.0, 2.0):
        s.tell(s.ask(), value)
    return path, path.read_bytes()


@pytest.mark.parametrize("ending", [b"", b"\n"], ids=["no-newline", "newline"])
def test_a_journal_whose_last_line_was_cut_short_names_the_line_and_the_repair(tmp_path, ending):
    path, data = _journal_of_two_trials(tmp_path)
    lines = data.count(b"\n")
    before_last = data.rstrip(b"\n").rfind(b"\n") + 1  # bytes of every line but the last
    path.write_bytes(data[:-10] + ending)  # a writer killed in the middle of its last line
    with pytest.raises(ConfigError) as e:
        study = optuna.create_study(storage=open_storage(str(path), "/x"), study_name="s", load_if_exists=True)
        study.ask()  # Optuna's next write lands on the damaged line; its next read fails
    msg = str(e.value)
    assert msg.startswith(f"journal file {str(path)!r}: line {lines} of {lines} is damaged (")
    assert f"truncate -s {before_last} {path}" in msg and "restore the file from a copy" in msg
    os.truncate(path, before_last)  # the repair the message gives: the study loses its last change only
    again = optuna.load_study(storage=open_storage(str(path), "/x"), study_name="s")
    assert [(t.state.name, t.value) for t in again.get_trials()] == [("COMPLETE", 1.0), ("RUNNING", None)]


def test_a_damaged_line_before_the_last_is_an_error_that_says_to_restore_a_copy(tmp_path):
    path, data = _journal_of_two_trials(tmp_path)
    lines = data.splitlines(keepends=True)
    lines[2] = lines[2][:5] + b"\n"
    path.write_bytes(b"".join(lines))
    with pytest.raises(ConfigError) as e:
        open_storage(str(path), "/x")
    msg = str(e.value)
    assert msg.startswith(f"journal file {str(path)!r}: line 3 of {len(lines)} is damaged (")
    assert "restore the file from a copy" in msg and "truncate" not in msg
