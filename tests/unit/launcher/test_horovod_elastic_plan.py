"""hvdkit run --horovod-elastic: the horovodrun line that hands a job to Horovod's elastic driver."""

import subprocess

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
