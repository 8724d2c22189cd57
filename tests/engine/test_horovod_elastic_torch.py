"""Horovod elastic (``@hvd.elastic.run``, ``TorchState``, ``ElasticSampler``) runs unchanged on
hvdkit's engine under ``horovodrun --gloo`` with a host discovery script (issue 27, item 1).

Upstream symptoms these tests were written against (each failed before its engine fix):
- one host (``localhost:2``) never started: the driver waited silently, for the whole elastic
  timeout, for a second host to detect network interfaces (02-elastic-one-host-starts-waits-say-why);
- a wait for slots printed nothing, and its timeout said ``waiting for {activity}`` (same fix);
- after a host was removed the ``ElasticSampler`` kept the old partition: samples were processed
  twice in that epoch (78-torch-elastic-sampler-repartitions-after-reset).
Script: scripts/hvd_torch_elastic.py (Horovod's public API only); harness shared with the Keras test
(support/elastic_jobs.py, scripts/elastic_hosts.py). Both hosts of the event test are
this machine (``localhost`` and ``127.0.0.1``), so no ssh is needed.
"""

import json

import pytest
from elastic_jobs import discovery_parents, run_elastic
from helpers import ROOT

pytestmark = pytest.mark.dist
SCRIPT = ROOT / "tests" / "engine" / "scripts" / "hvd_torch_elastic.py"
EXPECTED_TOTAL = 3 * sum(range(24))  # every sample once per epoch, 3 epochs


def _elastic(tmp_path, hosts, np_, min_np, max_np, extra=(), timeout=240, elastic_timeout=60, env=None):
    return run_elastic(SCRIPT, tmp_path, hosts, np_, min_np, max_np, extra, timeout, elastic_timeout, env)


@pytest.fixture(scope="module")
def one_host(tmp_path_factory):
    """An elastic job on ``localhost:2`` that runs to its end: its folder and finished process."""
    out = tmp_path_factory.mktemp("one-host")
    return out, _elastic(out, "localhost:2\n", 2, 1, 2, timeout=150, elastic_timeout=120)


def test_an_elastic_job_on_one_host_starts_at_once_and_ends_with_every_sample_once(one_host):
    # Before the fix: no output after start-up, until the elastic timeout (here 60 s) ended it.
    tmp_path, proc = one_host
    text = proc.stdout + proc.stderr
    assert proc.returncode == 0, text[-4000:]
    result = json.loads((tmp_path / "result.json").read_text())
    assert result == {"total": EXPECTED_TOTAL, "epochs": 3, "steps": 18, "size": 2}
    assert "waiting" not in proc.stderr  # nothing to wait for
    assert not (tmp_path / "resets").exists()


def test_the_driver_runs_the_discovery_script_as_its_own_child_without_a_python_middleman(one_host):
    """The driver runs the script every second for the whole job: upstream each run started a Python interpreter
    first (safe_shell_exec's spawned middleman, about 0.2 s of CPU), between the script and horovodrun."""
    out, proc = one_host
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    runs = discovery_parents(out)
    assert runs, "the discovery script never ran"
    for chain in runs:
        assert "horovodrun" in chain[-1], chain  # the launcher is found above the script
        between = chain[:-1]  # the shell that ran it (``sh -c SCRIPT``), if it did not exec the script itself
        assert all(c.split()[0].endswith("sh") for c in between), chain
        assert not any("multiprocessing" in c for c in chain), chain


def test_waiting_for_slots_says_what_it_waits_for_and_the_timeout_names_it(tmp_path):
    proc = _elastic(tmp_path, "localhost:2\n", 3, 3, 3, timeout=120, elastic_timeout=5)
    assert proc.returncode != 0
    assert (
        "waiting up to 5 s for 3 slot(s) on at least 1 host(s); host discovery lists 2 slot(s) on 1 host(s) (localhost)"
        in proc.stderr
    )
    assert "Timed out waiting for minimum number of slots to become available" in proc.stderr
    assert "{activity}" not in proc.stderr
    assert not (tmp_path / "result.json").exists()


def test_a_host_removed_added_and_a_killed_worker_resume_from_the_last_commit_with_every_sample_once(tmp_path):
    # The kill leaves its host out at once (engine fix 09 would otherwise start a new worker there).
    proc = _elastic(
        tmp_path, "localhost:1\n127.0.0.1:1\n", 2, 1, 2, extra=["events"], env={"HOROVOD_ELASTIC_HOST_FAILURES": "1"}
    )
    text = proc.stdout + proc.stderr
    assert proc.returncode == 0, text[-4000:]
    for marker in ("removed", "added", "killed"):  # every event happened
        assert (tmp_path / marker).exists(), text[-4000:]
    # reset callbacks on the remaining rank(s): 1 after the removal, 2 after the addition, 1 after the kill
    assert (tmp_path / "resets").read_text().split() == ["1", "2", "1"]
    result = json.loads((tmp_path / "result.json").read_text())
    assert result["total"] == EXPECTED_TOTAL  # no sample lost or processed twice across the changes
    assert (result["epochs"], result["size"]) == (3, 1)
    assert "DONE 0 1" in proc.stdout
