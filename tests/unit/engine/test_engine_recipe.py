"""`hvdkit engine install`: what is missing is named with the package that has it, before anything changes."""

import os
import subprocess
import sys

import pytest

from hvdkit import engine
from hvdkit.cli import main


@pytest.fixture
def bare_python(tmp_path):
    """A new venv with nothing installed: no torch, no TensorFlow, no Horovod."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(tmp_path / "bare")], check=True, timeout=120)
    return tmp_path / "bare" / "bin" / "python"


def path_without(tmp_path, *names):
    """A PATH folder with every system tool except ``names``."""
    folder = tmp_path / "path"
    folder.mkdir()
    for source in ("/usr/bin", "/bin"):
        for entry in os.scandir(source):
            if entry.name not in names and not (folder / entry.name).exists():
                (folder / entry.name).symlink_to(entry.path)
    return str(folder)


def test_an_environment_without_torch_is_named_with_the_pip_command_that_fixes_it(bare_python):
    with pytest.raises(engine.EngineError) as caught:
        engine.install(python=bare_python)
    message = str(caught.value)
    assert message.startswith(f"torch is not installed in {bare_python}; Horovod compiles against it."), message
    assert "pip install torch tensorflow-cpu keras" in message
    assert not list(bare_python.parent.parent.glob("lib/python3*/site-packages/.hvdkit-horovod-key"))


def test_a_machine_without_a_compiler_is_told_which_debian_package_to_install(bare_python, tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", path_without(tmp_path, "g++"))
    with pytest.raises(
        engine.EngineError,
        match=r"missing: g\+\+ \(the C\+\+ compiler; Debian package g\+\+\)\. "
        r"Install them: apt-get install -y g\+\+$",
    ):
        engine.install(python=bare_python)


def test_the_command_reports_the_error_in_one_line_and_exits_2(bare_python, capsys):
    assert main(["engine", "install", "--python", str(bare_python)]) == 2
    err = capsys.readouterr().err
    assert err.splitlines()[-1].startswith(f"hvdkit engine: error: torch is not installed in {bare_python}")
    assert "ERROR" not in err  # the recipe's own error line is not repeated above it


def test_jobs_below_one_is_a_clear_error_before_anything_runs(capsys):
    assert main(["engine", "install", "--jobs", "0"]) == 2
    assert capsys.readouterr().err == "hvdkit engine: error: --jobs must be at least 1 (got 0)\n"


def test_the_wheel_cache_key_holds_the_sdist_digest_and_an_unpinned_version_is_refused():
    """The sdist is checked against a pinned SHA-256, which is part of the key: another digest is another wheel."""

    def key_of(**extra):
        environ = {**os.environ, "PYTHON": sys.executable, **extra}
        return subprocess.run(
            ["bash", str(engine.BUILD_SCRIPT), "--key"], env=environ, capture_output=True, text=True, timeout=120
        )

    pinned, other = key_of(), key_of(HOROVOD_SDIST_SHA256="0" * 64)
    assert pinned.returncode == other.returncode == 0, pinned.stderr + other.stderr
    folder, key = pinned.stdout.strip().rsplit("-", 1)
    assert other.stdout.strip().rsplit("-", 1) != [folder, key] and other.stdout.startswith(folder)
    refused = key_of(HOROVOD_VERSION="0.27.0")
    assert refused.returncode == 1
    assert "no SHA-256 of the Horovod 0.27.0 sdist is pinned; set HOROVOD_SDIST_SHA256" in refused.stderr
