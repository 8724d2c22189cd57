"""The pool of long-lived 2-rank jobs (tests/support/pool.py) on real ranks: a case's answer comes back
from every rank; a case that raises, hangs or kills a rank fails naming that rank, its job is ended
(no process left) and the next case gets a fresh job; what a case changes does not reach the next.

Each failure test costs one job start; the hang runs under horovodrun --gloo, whose ranks live in
sessions of their own (the pool must end them by pid), the others under mpirun.
"""

import json
import os
import signal
import subprocess
import sys
import time

import pool
import pytest
from helpers import ROOT, pid_running

pytestmark = pytest.mark.dist
CASES = "pool_cases"


@pytest.mark.parametrize("launcher", ["mpirun", "horovodrun-gloo"])
def test_a_case_returns_every_ranks_answer_from_a_real_collective(launcher):
    got = pool.run_case(launcher, "torch", f"{CASES}:allreduce_of_ranks", {"scale": 3})
    assert [(g["rank"], g["size"], g["sum"]) for g in got] == [(0, 2, 9.0), (1, 2, 9.0)]


def test_the_next_case_finds_nothing_the_last_one_changed():
    first = pool.run_case("mpirun", "torch", f"{CASES}:leave_state_behind", {"marker": "x"})
    second = pool.run_case("mpirun", "torch", f"{CASES}:observe_state", env={"HVDKIT_POOL_CASE_VAR": "y"})
    for before, after in zip(first, second):
        assert after["env"] == {"HVDKIT_POOL_LEAK": None, "HVDKIT_LOG_LEVEL": None, "HVDKIT_POOL_CASE_VAR": "y"}
        assert after["log_state_keys"] == ["handler", "topology"] and after["log_leak"] is None
        assert after["handlers"] == before["handlers"] == 1
        assert after["sigusr1_default"] and after["threads"] == before["threads"]
        assert after["cwd"] == before["cwd"]
        # every case starts from the same seeds: torch's as in a fresh process, numpy's by rank
        assert after["torch_draw"] == before["torch_draw"] and after["numpy_draw"] == before["numpy_draw"]
    assert first[0]["torch_draw"] == first[1]["torch_draw"]
    assert first[0]["numpy_draw"] != first[1]["numpy_draw"]


def _ranks_of_live_job(launcher):
    job = pool.job_for(launcher, "torch")
    return job, dict(job.ranks)


def test_a_case_that_raises_on_one_rank_fails_with_that_ranks_traceback_and_the_next_gets_a_fresh_job():
    job, ranks = _ranks_of_live_job("mpirun")
    with pytest.raises(pool.PoolCaseError) as err:
        pool.run_case("mpirun", "torch", f"{CASES}:fail_on", {"rank": 1, "message": "broken on purpose"})
    message = str(err.value)
    assert "failed on rank(s) [1]" in message
    assert "--- rank 1 of" in message and "ValueError: broken on purpose" in message and "--- rank 0" not in message
    assert not any(pid_running(rank.pid) for rank in ranks.values()) and job.proc.poll() is not None
    after = pool.run_case("mpirun", "torch", f"{CASES}:allreduce_of_ranks", {"scale": 1})
    assert [g["sum"] for g in after] == [3.0, 3.0]
    assert {g["pid"] for g in after}.isdisjoint(rank.pid for rank in ranks.values())


def test_a_case_that_hangs_fails_naming_the_rank_with_its_stack_and_leaves_no_process():
    job, ranks = _ranks_of_live_job("horovodrun-gloo")
    with pytest.raises(pool.PoolCaseError) as err:
        pool.run_case("horovodrun-gloo", "torch", f"{CASES}:hang_on", {"rank": 1}, timeout=10)
    message = str(err.value)
    assert "did not finish within 10 s on rank(s) [1]" in message
    assert "hang_on" in message  # rank 1's stack, written by faulthandler
    assert not any(pid_running(rank.pid) for rank in ranks.values()) and job.proc.poll() is not None
    after = pool.run_case("horovodrun-gloo", "torch", f"{CASES}:allreduce_of_ranks", {"scale": 2})
    assert [g["sum"] for g in after] == [6.0, 6.0]


def test_a_case_that_kills_a_rank_fails_naming_it_and_leaves_no_process():
    job, ranks = _ranks_of_live_job("mpirun")
    with pytest.raises(pool.PoolCaseError) as err:
        pool.run_case("mpirun", "torch", f"{CASES}:exit_on", {"rank": 1, "code": 3}, timeout=120)
    assert "rank(s) [1] exited before reporting" in str(err.value)
    assert not any(pid_running(rank.pid) for rank in ranks.values()) and job.proc.poll() is not None


_OWNER = """
import json, os, signal, sys
sys.path[:0] = [sys.argv[1] + "/tests/support", sys.argv[1] + "/tests"]
import pool
job = pool.job_for("horovodrun-gloo", "torch")
job.park()
ranks = list(job.ranks.values())
reaper = pool._REAPER[0].pid if getattr(pool, "_REAPER", None) else None
pids = [job.proc.pid] + [r.pid for r in ranks] + [r.pgid for r in ranks]
print(json.dumps({"pids": pids, "reaper": reaper, "dir": str(job.dir)}))
sys.stdout.flush()
sys.stdin.readline()  # the test holds every process by a pidfd now
os.kill(os.getpid(), signal.SIGKILL)  # as a pytest worker killed (or interrupted) before close_all
"""


def test_a_pool_whose_process_is_killed_leaves_no_process_of_its_parked_job_nor_its_folder():
    owner = subprocess.Popen(
        [sys.executable, "-c", _OWNER, str(ROOT)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    held = {}
    try:
        seen = json.loads(owner.stdout.readline())
        for pid in {*seen["pids"], seen["reaper"]} - {None}:
            try:
                held[pid] = os.pidfd_open(pid)
            except ProcessLookupError:
                pass
        assert seen["pids"][0] in held, seen  # the launcher was there when the owner was killed
        owner.stdin.write("go\n")
        owner.stdin.flush()
        assert owner.wait(60) == -signal.SIGKILL

        def alive():
            out = []
            for pid, fd in held.items():
                try:
                    signal.pidfd_send_signal(fd, 0)
                except ProcessLookupError:
                    continue
                if pid_running(pid):  # a zombie is ended; its parent (init) reaps it
                    out.append(pid)
            return out

        deadline = time.monotonic() + 30
        while alive() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert alive() == [], f"processes of the pool job left after its owner was killed: {alive()}"
        assert not os.path.exists(seen["dir"]), "the pool job's folder was left behind"
    finally:
        owner.kill()
        owner.wait()
        for fd in held.values():  # what the pool left (the failure above): by pidfd, never by name
            try:
                signal.pidfd_send_signal(fd, signal.SIGKILL)
            except ProcessLookupError:
                pass
            os.close(fd)
