"""The test pool (tests/support/pool.py) signals only its own ranks, even once a rank's pid number has gone to
another process. Parking a job (SIGSTOP after every module) by pid number stopped whatever process had been
given the number of a rank that had ended, and a stopped process with a SIGTERM handler ignores SIGTERM.

The reuse is made certain, not waited for: the scenario runs in a pid namespace of its own (unshare, root),
where writing ns_last_pid gives the next process the number of the rank that ended."""

import json
import subprocess
import sys
import textwrap

import pytest
from helpers import ROOT

_SCENARIO = textwrap.dedent(
    """
    import json, os, signal, subprocess, sys, tempfile, time
    from pathlib import Path
    sys.path[:0] = [sys.argv[1] + "/tests/support", sys.argv[1] + "/tests"]
    import pool

    def state(pid):
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]

    def settled(pid, want, bound=10.0):  # a signal to another process takes effect when it next runs
        deadline = time.monotonic() + bound
        while state(pid) not in want and time.monotonic() < deadline:
            time.sleep(0.01)
        return state(pid)

    def start():  # a process that has started and sleeps
        proc = subprocess.Popen(
            [sys.executable, "-c", "import time; print('up', flush=True); time.sleep(120)"], stdout=subprocess.PIPE
        )
        assert proc.stdout.readline() == b"up\\n"
        return proc

    launcher, rank0, rank1 = start(), start(), start()
    job = object.__new__(pool.Job)  # the launcher still runs; a job's ranks as wait_ready() records them
    job.launcher, job.framework, job.parked, job.ranks = "mpirun", "torch", False, {}
    job.proc, job.dir = launcher, Path(tempfile.mkdtemp())
    for r, proc in enumerate((rank0, rank1)):
        (job.dir / f"ready.rank{r}.json").write_text(json.dumps({"pid": proc.pid, "pgid": os.getpgrp()}))
    job.wait_ready()

    rank0.kill()
    rank0.wait()  # rank 0 has ended (between two modules, say); its number is free
    with open("/proc/sys/kernel/ns_last_pid", "w") as f:
        f.write(str(rank0.pid - 1))
    stranger = start()
    reused = stranger.pid == rank0.pid
    job.park()
    seen = {"reused": reused, "rank1": settled(rank1.pid, "T")}
    time.sleep(0.5)  # rank 1 has stopped: a SIGSTOP sent to the stranger in the same loop has taken effect too
    seen["stranger"] = state(stranger.pid)
    job.wake()
    seen["rank1_woken"] = settled(rank1.pid, "SR")
    os.kill(stranger.pid, signal.SIGCONT)
    for proc in (launcher, rank1, stranger):
        proc.kill()
        proc.wait()
    print(json.dumps(seen))
    """
)


def test_parking_a_job_whose_rank_ended_leaves_the_process_that_got_its_pid_running():
    try:
        done = subprocess.run(
            ["unshare", "--pid", "--fork", "--mount-proc", sys.executable, "-c", _SCENARIO, str(ROOT)],
            capture_output=True,
            text=True,
            timeout=120,
        )
    except FileNotFoundError:
        pytest.skip("needs unshare (util-linux)")
    if done.returncode != 0 and "Operation not permitted" in done.stderr:
        pytest.skip("needs root: a pid namespace of its own")
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["reused"], "the scenario could not give the ended rank's number to a new process"
    assert seen["rank1"] == "T"  # the live rank is parked ...
    assert seen["rank1_woken"] in ("S", "R")  # ... and woken
    assert seen["stranger"] in ("S", "R"), f"the process that got the ended rank's pid was left {seen['stranger']}"
