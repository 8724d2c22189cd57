"""`hvdkit run --timeline`: the path is checked and made absolute, and reaches every rank's environment."""

import os

import pytest

from hvdkit.core import ConfigError
from hvdkit.diagnostics.timeline import ensure_folder
from hvdkit.launcher.plan import build
from hvdkit.launcher.spec import JobSpec

CMD = ["python", "t.py"]


def test_mpirun_exports_the_absolute_timeline_path_to_every_rank(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    plan = build(JobSpec(CMD, 2, timeline="out/tl.json"), is_root=False, cores=2)
    assert plan.env["HOROVOD_TIMELINE"] == str(tmp_path / "out" / "tl.json")
    argv = list(plan.argv)
    assert argv[argv.index("HOROVOD_TIMELINE") - 1] == "-x"
    assert "HOROVOD_TIMELINE_MARK_CYCLES" not in plan.env


def test_horovodrun_gets_the_timeline_in_its_environment_and_no_extra_arguments(tmp_path):
    plain = build(JobSpec(CMD, 2, controller="gloo"), is_root=False, cores=2)
    traced = build(JobSpec(CMD, 2, controller="gloo", timeline=str(tmp_path / "tl.json")), is_root=False, cores=2)
    assert traced.argv == plain.argv
    assert traced.env["HOROVOD_TIMELINE"] == str(tmp_path / "tl.json")
    assert "HOROVOD_TIMELINE" not in plain.env


def test_mark_cycles_sets_horovods_variable_and_exports_it(tmp_path):
    plan = build(JobSpec(CMD, 2, timeline=str(tmp_path / "tl.json"), timeline_mark_cycles=True), is_root=False, cores=2)
    assert plan.env["HOROVOD_TIMELINE_MARK_CYCLES"] == "1"
    argv = list(plan.argv)
    assert argv[argv.index("HOROVOD_TIMELINE_MARK_CYCLES") - 1] == "-x"


def test_the_flag_wins_over_a_timeline_variable_given_in_the_job_env(tmp_path):
    spec = JobSpec(CMD, 2, env={"HOROVOD_TIMELINE": "/elsewhere.json"}, timeline=str(tmp_path / "tl.json"))
    assert build(spec, is_root=False, cores=2).env["HOROVOD_TIMELINE"] == str(tmp_path / "tl.json")


def test_a_missing_folder_is_accepted_and_created_only_when_the_job_starts(tmp_path):
    target = tmp_path / "a" / "b" / "tl.json"
    spec = JobSpec(CMD, 2, timeline=str(target))
    assert not (tmp_path / "a").exists()  # planning stays free of side effects
    ensure_folder(spec.timeline)
    assert (tmp_path / "a" / "b").is_dir() and not target.exists()


def test_a_folder_under_a_file_is_rejected_naming_the_path(tmp_path):
    (tmp_path / "file").write_text("x")
    bad = str(tmp_path / "file" / "sub" / "tl.json")
    with pytest.raises(ConfigError, match=r"--timeline '.*/file/sub/tl\.json': folder .* cannot be created") as e:
        JobSpec(CMD, 2, timeline=bad)
    assert f"{tmp_path / 'file'}' is not a directory" in str(e.value)


def test_a_directory_as_the_timeline_is_rejected_with_an_example_file(tmp_path):
    with pytest.raises(ConfigError, match=r"is a directory; give a file in it, e\.g\. .*timeline\.json"):
        JobSpec(CMD, 2, timeline=str(tmp_path))


@pytest.mark.skipif(os.geteuid() == 0, reason="root may write anywhere")
def test_an_unwritable_folder_is_rejected(tmp_path):
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    with pytest.raises(ConfigError, match="is not writable"):
        JobSpec(CMD, 2, timeline=str(locked / "tl.json"))


def test_mark_cycles_without_a_timeline_says_what_is_missing():
    with pytest.raises(ConfigError, match="--timeline-mark-cycles needs --timeline FILE"):
        JobSpec(CMD, 2, timeline_mark_cycles=True)


def test_cli_reports_a_bad_timeline_path_before_anything_starts(tmp_path, capsys):
    from hvdkit.cli import main

    (tmp_path / "file").write_text("x")
    bad = str(tmp_path / "file" / "tl.json")
    assert main(["run", "-np", "1", "--timeline", bad, "--", "python", "-c", "pass"]) == 2
    assert f"hvdkit run: error: --timeline '{bad}'" in capsys.readouterr().err


def test_cli_dry_run_shows_the_timeline_export(tmp_path, capsys):
    from hvdkit.cli import main

    tl = str(tmp_path / "tl.json")
    assert (
        main(["run", "-np", "2", "--dry-run", "--timeline", tl, "--timeline-mark-cycles", "--", "python", "-c", "pass"])
        == 0
    )
    words = capsys.readouterr().out.split()
    assert words[words.index("HOROVOD_TIMELINE") - 1] == "-x"
    assert words[words.index("HOROVOD_TIMELINE_MARK_CYCLES") - 1] == "-x"
