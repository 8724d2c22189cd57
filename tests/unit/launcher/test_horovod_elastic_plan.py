"""hvdkit run --horovod-elastic: the horovodrun line that hands a job to Horovod's elastic driver."""

import os
import shlex
import subprocess

import pytest
from helpers import HVDKIT

from hvdkit.launcher.elastic.horovod_driver import build_horovod_elastic
from hvdkit.launcher.elastic.rules import ElasticSettings
from hvdkit.launcher.hosts import Host
from hvdkit.launcher.spec import JobSpec

PY = "/venv/bin/python"


def test_a_discovery_script_job_becomes_one_elastic_horovodrun_without_rank_wrappers():
    spec = JobSpec(["python", "train.py"], 2, controller="mpi", env={"A": "1"})
    settings = ElasticSettings(num_proc=2, min_np=1, max_np=4, timeout=30.4)
    plan = build_horovod_elastic(spec, settings, "/d.sh", python=PY)
    assert list(plan.argv[1:]) == [
        *("-np", "2", "--min-np", "1", "--max-np", "4", "--host-discovery-script", "/d.sh"),
        *("--elastic-timeout", "30", "--gloo", "python", "train.py"),
    ]
    assert plan.env == {"A": "1", "PYTHONUNBUFFERED": "1"}  # no HVDKIT_JOB_ID: no rank wrappers


def test_fixed_hosts_go_to_horovodrun_as_its_host_list_and_the_nic_is_passed_on():
    spec = JobSpec(["python", "t.py"], 2, hosts=(Host("a", 1), Host("b", 1)), network_interface="eth1")
    plan = build_horovod_elastic(spec, ElasticSettings(num_proc=2, min_np=1, max_np=2), None, python=PY)
    argv = list(plan.argv)
    assert argv[argv.index("-H") + 1] == "a:1,b:1"
    assert argv[argv.index("--network-interface") + 1] == "eth1"
    assert "--host-discovery-script" not in argv


def test_horovod_elastic_without_elastic_bounds_is_an_error_naming_the_flags_it_needs():
    proc = subprocess.run(
        [HVDKIT, "run", "-np", "2", "--horovod-elastic", "--dry-run", "--", "true"], text=True, capture_output=True
    )
    assert proc.returncode != 0
    assert (
        "--horovod-elastic runs Horovod's elastic driver, which needs the elastic bounds: add --min-np" in proc.stderr
    )


def test_timeline_stall_timeout_and_slots_per_host_reach_horovodrun(tmp_path):
    # --horovod-elastic dropped --timeline and --stall-timeout without a word (issue 35, item 7)
    timeline = str(tmp_path / "t.json")
    spec = JobSpec(["python", "t.py"], 2, timeline=timeline, timeline_mark_cycles=True)
    settings = ElasticSettings(num_proc=2, min_np=1, max_np=2)
    plan = build_horovod_elastic(spec, settings, "/d.sh", python=PY, stall_timeout=90.5, slots_per_host=4)
    argv = list(plan.argv)
    assert argv[argv.index("--slots-per-host") + 1] == "4"
    assert argv[argv.index("--timeline-filename") + 1] == timeline and "--timeline-mark-cycles" in argv
    # whole seconds, rounded up, and the warning time hvdkit's own ranks derive from them
    assert argv[argv.index("--stall-check-shutdown-time-seconds") + 1] == "91"
    assert argv[argv.index("--stall-check-warning-time-seconds") + 1] == "30"
    assert argv[-3:] == ["--gloo", "python", "t.py"]


def _dry_run(tmp_path, *flags, env=None):
    script = tmp_path / "discover.sh"
    script.write_text("#!/bin/sh\necho localhost:2\n")
    script.chmod(0o755)
    argv = [HVDKIT, "run", "-np", "2", "--min-np", "1", "--max-np", "2", "--host-discovery-script", str(script)]
    argv += ["--horovod-elastic", *flags, "--dry-run", "--", "python", "-c", "pass"]
    base = {k: v for k, v in os.environ.items() if not k.startswith("HVDKIT_")}
    return subprocess.run(argv, text=True, capture_output=True, env={**base, **(env or {})}, cwd=tmp_path)


def test_hvdkit_run_horovod_elastic_passes_timeline_and_stall_timeout_on(tmp_path):
    proc = _dry_run(tmp_path, "--timeline", "out/t.json", "--stall-timeout", "120", "--slots-per-host", "3")
    assert proc.returncode == 0, proc.stderr
    argv = shlex.split(proc.stdout)
    assert argv[argv.index("--timeline-filename") + 1] == str(tmp_path / "out" / "t.json")
    assert argv[argv.index("--stall-check-shutdown-time-seconds") + 1] == "120"
    assert argv[argv.index("--slots-per-host") + 1] == "3"


@pytest.mark.parametrize(
    ("flags", "env", "message"),
    [
        (["--max-restarts", "3"], {}, "--max-restarts (or HVDKIT_MAX_RESTARTS) does not apply with --horovod-elastic"),
        ([], {"HVDKIT_MAX_RESTARTS": "3"}, "unset HVDKIT_MAX_RESTARTS"),
        (["--discovery-interval", "2"], {}, "--discovery-interval (or HVDKIT_DISCOVERY_INTERVAL) does not apply"),
    ],
)
def test_hvdkit_run_horovod_elastic_refuses_the_restart_loops_options_naming_them(tmp_path, flags, env, message):
    proc = _dry_run(tmp_path, *flags, env=env)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert message in proc.stderr
    assert proc.stdout == ""  # no plan printed
