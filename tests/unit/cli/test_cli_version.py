"""``hvdkit --version``: hvdkit's version, the engine fixes it ships, the fix level of the installed engine."""

import importlib.util
from types import SimpleNamespace

import pytest

import hvdkit
from hvdkit import engine
from hvdkit.cli import installed_engine_level, main


def test_version_names_hvdkit_the_shipped_fixes_and_the_installed_engine(capsys):
    assert main(["--version"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"hvdkit {hvdkit.__version__}; engine fixes {engine.fix_level()}; installed engine: ")
    assert out.rstrip().endswith(f"{engine.fix_level()} (current)")  # make setup built this checkout's engine


def fake_horovod(tmp_path, marker):
    folder = tmp_path / "horovod"
    folder.mkdir()
    if marker is not None:
        (folder / "hvdkit_fixes.py").write_text(marker)
    return SimpleNamespace(submodule_search_locations=[str(folder)])


@pytest.mark.parametrize(
    "marker, level",
    [
        ('LEVEL = "hvdkit-fixes-0123456789ab"\nFIXES = []\n', "hvdkit-fixes-0123456789ab"),
        (None, "upstream"),
    ],
)
def test_the_installed_level_is_read_from_the_marker_without_importing_horovod(tmp_path, monkeypatch, marker, level):
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: fake_horovod(tmp_path, marker))
    assert installed_engine_level() == level


def test_no_engine_and_another_level_are_said_with_the_fix(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    main(["--version"])
    assert capsys.readouterr().out.rstrip().endswith("installed engine: none (install it: hvdkit engine install)")
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name: fake_horovod(tmp_path, 'LEVEL = "hvdkit-fixes-old"\n')
    )
    main(["--version"])
    assert "hvdkit-fixes-old (another hvdkit's; rebuild it: hvdkit engine install)" in capsys.readouterr().out


def test_no_command_is_an_error_listing_the_commands(capsys):
    with pytest.raises(SystemExit) as done:
        main([])
    assert done.value.code == 2
    assert (
        "a command is required: one of run, tune, render, timeline, bench, engine, doctor (or --version)"
        in capsys.readouterr().err
    )
