import io
import os
import shutil
import subprocess
import sys
from pathlib import Path
from unittest.mock import ANY

from hvdkit import engine
from hvdkit.diagnostics import doctor
from hvdkit.launcher.hosts import Host


def test_check_build_report_is_parsed():
    report = (
        "Available Frameworks:\n    [X] TensorFlow\n    [X] PyTorch\n    [ ] MXNet\n\n"
        "Available Controllers:\n    [X] MPI\n    [ ] Gloo\n"
    )
    assert doctor.check_build(report) == {
        "TensorFlow": True,
        "PyTorch": True,
        "MXNet": False,
        "MPI": True,
        "Gloo": False,
    }


def test_a_missing_horovod_is_a_problem_with_the_fix(monkeypatch):
    real = doctor._version
    monkeypatch.setattr(doctor, "_version", lambda *names: None if "horovod" in names else real(*names))
    out = io.StringIO()
    problems = doctor.diagnose(smoke=False, out=out)
    assert any(p.startswith("horovod is missing: run `hvdkit engine install`") for p in problems)
    assert "horovod                    MISSING" in out.getvalue()


def test_the_engine_fix_level_is_read_from_check_build_and_its_absence_means_unpatched():
    patched = "    Horovod v0.28.1:\n    hvdkit engine fixes: hvdkit-fixes-0123456789ab (3 fixes)\n\n    Available Frameworks:\n"
    assert doctor.engine_fix_level(patched) == "hvdkit-fixes-0123456789ab (3 fixes)"
    assert doctor.engine_fix_level("    Horovod v0.28.1:\n\n    Available Frameworks:\n") is None
    assert doctor.engine_fix_level("    hvdkit engine fixes: none (unpatched upstream engine)\n") is None


def _engine_rows(installed):
    rows = {}
    doctor._engine_fixes_row(installed, lambda name, value, fix=None: rows.setdefault(name, (value, fix)))
    return rows


def test_an_engine_with_the_fix_level_this_hvdkit_ships_passes():
    shipped = engine.fix_level()
    assert _engine_rows(f"{shipped} (16 fixes)") == {"horovod engine fixes": (f"{shipped} (16 fixes)", None)}


def test_an_engine_from_another_recipe_or_unpatched_is_a_problem_whose_fix_is_hvdkit_engine_install():
    shipped = engine.fix_level()
    value, fix = _engine_rows("hvdkit-fixes-000000000000 (3 fixes)")["horovod engine fixes"]
    assert value is None
    assert f"the engine carries hvdkit-fixes-000000000000 (3 fixes), this hvdkit ships {shipped}" in fix
    assert "run `hvdkit engine install`" in fix
    value, fix = _engine_rows(None)["horovod engine fixes"]
    assert value is None and fix.startswith("an unpatched upstream engine") and "hvdkit engine install" in fix


def _venv_with_a_space(tmp_path, tools=()):
    """A virtualenv at ``.../my venv`` (this one's packages, linked) whose bin holds python and ``tools``."""
    venv = tmp_path / "my venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "pyvenv.cfg").write_text((Path(sys.prefix) / "pyvenv.cfg").read_text())
    (venv / "lib").symlink_to(Path(sys.prefix) / "lib")
    (venv / "bin" / "python").symlink_to(sys.executable)
    for tool in tools:
        (venv / "bin" / tool).symlink_to(Path(sys.executable).with_name(tool))
    return venv / "bin" / "python"


def _path_with_only(tmp_path, *tools):
    """A PATH folder with only these system tools, and an ``ssh`` that runs its command here.

    Like real ssh it joins the command's words with spaces for the remote user's shell (here: bash -c).
    """
    folder = tmp_path / "path"
    folder.mkdir()
    for tool in ("bash", "sh", "ip", *tools):
        (folder / tool).symlink_to(shutil.which(tool))
    ssh = folder / "ssh"
    ssh.write_text(
        "#!/bin/bash\nwhile [[ $1 == -* && $1 != -- ]]; do [[ $1 == -o ]] && shift; shift; done\n"
        'shift; [[ $1 == -- ]] && shift\nexec bash -c "$*"\n'
    )
    ssh.chmod(0o755)
    return str(folder)


def test_doctor_names_a_missing_mpirun_and_horovodrun_and_where_it_looked(tmp_path, monkeypatch):
    python = _venv_with_a_space(tmp_path)
    monkeypatch.setenv("PATH", _path_with_only(tmp_path))
    out = io.StringIO()
    problems = doctor.diagnose(python=str(python), smoke=False, out=out, hosts=(Host("10.255.255.1"),))
    text = "\n".join(problems)
    assert f"mpirun is not next to {python} nor on PATH" in text, out.getvalue()
    assert f"horovodrun is not next to {python} nor on PATH" in text, out.getvalue()
    assert "rebuild Horovod" not in text  # the engine is fine; its launcher was not found


def test_a_failing_check_build_is_reported_as_such_not_as_an_engine_built_without_every_part(tmp_path):
    python = _venv_with_a_space(tmp_path)
    horovodrun = python.with_name("horovodrun")
    horovodrun.write_text("#!/bin/sh\necho 'ImportError: libmpi.so.40: cannot open shared object file' >&2\nexit 1\n")
    horovodrun.chmod(0o755)
    out = io.StringIO()
    problems = doctor.diagnose(python=str(python), smoke=False, out=out)
    assert [p for p in problems if "horovod" in p] == [
        "horovodrun --check-build is missing: it failed (ImportError: libmpi.so.40: cannot open shared object file); "
        "run it by hand to see why, or run `hvdkit engine install` (it builds Horovod for this environment; in an "
        "hvdkit checkout `make setup` does it)"
    ], out.getvalue()
    assert "horovod built with" not in out.getvalue()


def test_doctor_with_a_broken_mpirun_reports_it_instead_of_a_traceback(tmp_path):
    python = _venv_with_a_space(tmp_path)  # no horovodrun either: no 30 s check-build
    broken = python.with_name("mpirun")
    broken.write_bytes(b"\x7fELF\x02\x01\x01 not a program")
    broken.chmod(0o755)
    env = {**os.environ, "PATH": _path_with_only(tmp_path)}
    done = subprocess.run(
        [str(python), "-m", "hvdkit", "doctor", "--no-smoke", "-H", "10.255.255.1"],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=120,
    )
    assert "Traceback" not in done.stderr, done.stderr
    assert done.returncode == 1
    assert f"cannot run {broken} (Exec format error)" in done.stdout, done.stdout


def test_doctor_hosts_runs_a_python_whose_path_has_a_space_on_the_other_host(tmp_path, monkeypatch):
    python = _venv_with_a_space(tmp_path)
    monkeypatch.setenv("PATH", _path_with_only(tmp_path, "mpirun"))
    rows = {}
    doctor._diagnose_hosts(
        (Host("10.255.255.1"),),
        str(python),
        None,
        lambda name, value, fix=None: rows.setdefault(name, (value, fix)),
        False,
    )
    assert rows["host 10.255.255.1"] == ("reachable, same versions", ANY), rows


def _engine_without_tensorflow(tmp_path):
    python = _venv_with_a_space(tmp_path)
    horovodrun = python.with_name("horovodrun")
    report = "Available Frameworks:\\n    [ ] TensorFlow\\n    [X] PyTorch\\n\\nAvailable Controllers:\\n    [X] MPI\\n    [X] Gloo\\n"
    horovodrun.write_text(f"#!/bin/sh\nprintf '{report}'\n")
    horovodrun.chmod(0o755)
    return python


def test_a_pytorch_only_engine_is_no_problem_where_tensorflow_is_not_installed(tmp_path, monkeypatch):
    python = _engine_without_tensorflow(tmp_path)
    real = doctor._version
    monkeypatch.setattr(doctor, "_version", lambda *names: None if "tensorflow" in names else real(*names))
    out = io.StringIO()
    problems = doctor.diagnose(python=str(python), smoke=False, out=out)
    assert not [p for p in problems if "TensorFlow" in p], problems
    assert (
        "horovod built with TensorFlow no (TensorFlow is not installed here: a PyTorch-only engine)" in out.getvalue()
    )


def test_an_engine_without_tensorflow_is_a_problem_where_tensorflow_is_installed(tmp_path):
    python = _engine_without_tensorflow(tmp_path)
    problems = doctor.diagnose(python=str(python), smoke=False, out=io.StringIO())
    assert "horovod built with TensorFlow is missing: rebuild Horovod: run `hvdkit engine install`" in "\n".join(
        problems
    )
