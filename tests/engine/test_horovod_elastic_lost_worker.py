"""Horovod's elastic driver: a lost worker process is not a lost host (issue 37, item 1; engine fix
09-elastic-lost-worker-not-its-host).

Upstream, one worker that failed made the driver blacklist its whole host: the blacklist set the
host's event, which killed the survivors on it too, and a job on one host ended ("blacklisted slots
count == 2 -> stop running"); the failed slot of a host that stayed was never started again. Now
the survivors go on at the smaller size, a new worker takes the slot and joins at their next
commit, and only a host whose workers fail HOROVOD_ELASTIC_HOST_FAILURES times within
HOROVOD_ELASTIC_HOST_FAILURE_WINDOW seconds is left out, with a line naming it. Engine fix
16-elastic-joining-worker-starts-first: the new worker is started before the survivors are told of
its slot, and they are told only once its imports are done, so they train on meanwhile.
Script: scripts/hvd_torch_lost_worker.py (Horovod's public API only).
"""

import json
import re

import pytest
from elastic_jobs import run_elastic
from helpers import ROOT

pytestmark = pytest.mark.dist
SCRIPT = ROOT / "tests" / "engine" / "scripts" / "hvd_torch_lost_worker.py"


def _run(tmp_path, hosts, mode, env=None):
    # A discovery script that lists ``hosts`` throughout (horovodrun refuses -H with one host in
    # elastic mode). The survivors wait in Gloo's rendezvous while a new worker imports torch:
    # on a loaded 2-core machine that can take longer than Gloo's default 30 s.
    env = {"HOROVOD_GLOO_TIMEOUT_SECONDS": "120", **(env or {})}
    return run_elastic(SCRIPT, tmp_path, hosts, 2, 1, 2, [mode], timeout=300, elastic_timeout=60, env=env)


def _done(stdout):
    """The ``DONE rank size`` lines of the ranks that finished (horovodrun prefixes ``[i]<stdout>:``)."""
    return sorted(re.findall(r"DONE \d+ \d+", stdout))


def _steps(tmp_path):
    """``(step, size, rank, host, pid)`` of every step line, in the order written."""
    rows = [line.split() for line in (tmp_path / "steps.log").read_text().splitlines()]
    return [(int(step), int(size), int(rank), host, int(pid)) for _, step, size, rank, host, pid in rows]


def test_a_killed_worker_on_a_host_that_stays_is_replaced_and_the_survivor_trains_meanwhile(tmp_path):
    # Before the fix: the kill blacklisted localhost, whose event ended the survivor too; the job
    # exited 1 with "blacklisted slots count == 2 -> stop running" (no step at size 1).
    proc = _run(tmp_path, "localhost:2\n", "kill")
    text = proc.stdout + proc.stderr
    assert proc.returncode == 0, text[-4000:]
    assert (tmp_path / "killed").exists()
    steps = _steps(tmp_path)
    sizes = [size for _, size, *_ in steps]
    first_alone = sizes.index(1)
    assert 2 in sizes[:first_alone]  # the job trained at 2 ranks before the kill
    assert 2 in sizes[first_alone:]  # ... at 1 rank after it, then at 2 again
    alone = {(rank, pid) for _, size, rank, _, pid in steps if size == 1}
    assert len(alone) == 1 and next(iter(alone))[0] == 0  # one survivor, rank 0 while alone
    starts = (tmp_path / "starts.log").read_text().split("\n")[:-1]
    assert len(starts) == 3  # 2 workers, then 1 new worker on the killed one's slot
    after = {pid for _, size, _, _, pid in steps[first_alone:] if size == 2}
    newcomer = int(starts[2].split()[1])
    assert newcomer in after and len(after) == 2  # the survivor and the new worker
    # Fix 16: the new worker is started before the survivor is told of its slot, which it is only once
    # the new worker's imports are done (before: told 1 s after it went on alone, it reset, then the
    # driver started the new worker, and the survivor waited in Gloo's rendezvous through its imports).
    order = (tmp_path / "order.log").read_text().splitlines()
    told = [i for i, line in enumerate(order) if line.startswith("interrupted 1 ")]
    assert told and told[0] > order.index(f"imported {newcomer}"), order
    final = [json.loads((tmp_path / f"final.{rank}.json").read_text()) for rank in (0, 1)]
    assert final[0] == final[1] and len(final[0]) == 5
    assert "left out" not in proc.stderr  # one failure: the host stays
    assert _done(proc.stdout) == ["DONE 0 2", "DONE 1 2"]


def test_a_host_whose_workers_keep_failing_is_left_out_with_a_line_naming_it(tmp_path):
    # Before the fix: the first failure blacklisted the host at once and silently (1 start there,
    # no line); its slot was never tried again.
    env = {"HOROVOD_ELASTIC_HOST_FAILURES": "2", "HOROVOD_ELASTIC_HOST_FAILURE_WINDOW": "120"}
    proc = _run(tmp_path, "localhost:1\n127.0.0.1:1\n", "fail", env=env)
    text = proc.stdout + proc.stderr
    assert proc.returncode == 0, text[-4000:]
    bad = (tmp_path / "bad_host").read_text()
    good = {"localhost", "127.0.0.1"} - {bad}
    starts = [line.split()[0] for line in (tmp_path / "starts.log").read_text().splitlines()]
    assert sorted(starts) == sorted([*good, bad, bad])  # the bad host was tried again once, then left out
    lines = [line for line in proc.stderr.splitlines() if "left out" in line]
    assert lines == [
        f"horovodrun: host {bad} left out: 2 worker failures within 120 s "
        "(HOROVOD_ELASTIC_HOST_FAILURES=2, HOROVOD_ELASTIC_HOST_FAILURE_WINDOW=120)"
    ], text[-4000:]
    steps = _steps(tmp_path)
    assert steps[-1][1:4] == (1, 0, *good)  # the job ended on the other host, alone
    assert _done(proc.stdout) == ["DONE 0 1"]
