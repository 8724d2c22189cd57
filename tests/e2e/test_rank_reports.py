"""How ranks tell `hvdkit run` their pid and exit status, and what the launcher does with it.

Ranks write nothing to disk (a file at a predictable path could be a planted symlink), and the
launcher signals a pid only if it is a rank wrapper of its own job on its own host.
"""

import os
import signal
import socket
import subprocess
import time

import pytest
from helpers import PYTHON, ROOT, hvdkit_run, run_bounded

pytestmark = pytest.mark.dist
FORGE = str(ROOT / "tests" / "e2e" / "scripts" / "forge_report.py")
RANK_1_OF_2 = {
    "OMPI_COMM_WORLD_RANK": "1",
    "OMPI_COMM_WORLD_SIZE": "2",
    "OMPI_COMM_WORLD_LOCAL_RANK": "1",
    "OMPI_COMM_WORLD_LOCAL_SIZE": "2",
}


def start_wrapper(job_id, folder):
    """A real rank wrapper of job ``job_id`` running ``sleep`` (in its own session, ended by the test)."""
    env = dict(os.environ, HVDKIT_JOB_ID=job_id, HVDKIT_STATUS_DIR=str(folder), **RANK_1_OF_2)
    proc = subprocess.Popen(
        [PYTHON, "-m", "hvdkit.launcher.rankwrap", "--", "sleep", "300"],
        env=env,
        cwd=ROOT,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:  # running its command: the wrapper is set up
        with open(f"/proc/{proc.pid}/task/{proc.pid}/children") as f:
            if f.read().split():
                return proc
        time.sleep(0.05)
    pytest.fail("the rank wrapper did not start its command")


def end(proc):
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def test_a_symlink_planted_where_a_rank_record_would_go_is_not_followed(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    folder = tmp_path / "hvdkit-run-planted"  # e.g. made by another user on a host the ranks run on
    folder.mkdir(mode=0o700)
    planted = [".rank-1.json.tmp", "rank-1.json", ".rank-1.pid.tmp", "rank-1.pid"]
    for name in planted:
        (folder / name).symlink_to(victim)
    env = {"HVDKIT_JOB_ID": "j1", "HVDKIT_STATUS_DIR": str(folder), **RANK_1_OF_2}
    proc = run_bounded([PYTHON, "-m", "hvdkit.launcher.rankwrap", "--", PYTHON, "-c", "print('ran')"], 60, env=env)
    assert proc.returncode == 0 and proc.stdout == "ran\n", proc.stderr
    assert victim.read_text() == "precious\n"
    assert sorted(os.listdir(folder)) == sorted(planted)
    assert all(os.readlink(folder / name) == str(victim) for name in planted)


def test_a_record_of_another_jobs_rank_never_gets_it_signalled(tmp_path):
    other = start_wrapper("another-job", tmp_path)  # another job's rank on this host
    try:
        proc = hvdkit_run("-np", "2", "--", PYTHON, FORGE, str(other.pid), str(tmp_path), timeout=240)
        assert proc.returncode == 3, proc.stderr[-3000:]  # the job ran: rank 1 failed on purpose
        assert (tmp_path / "forged").exists()
        assert "hvdkit run: rank 1 exited with code 3" in proc.stderr
        time.sleep(1)
        assert other.poll() is None  # neither SIGTERM nor SIGKILL reached the other job's rank
    finally:
        end(other)


def test_only_rank_wrappers_of_this_job_on_this_host_count_as_its_ranks(tmp_path):
    from hvdkit.launcher.rank_signals import local_rank_pids

    ours, theirs = start_wrapper("job-1", tmp_path), start_wrapper("job-2", tmp_path)
    here = socket.gethostname()
    try:
        started = {
            0: {"pid": ours.pid, "host": here},
            1: {"pid": theirs.pid, "host": here},  # a wrapper, but of another job
            2: {"pid": ours.pid, "host": "elsewhere"},  # a pid from another host means another process here
            3: {"pid": os.getpid(), "host": here},  # not a rank wrapper at all
            4: {"pid": "1", "host": here},
        }
        assert local_rank_pids(started, "job-1") == [ours.pid]
        assert local_rank_pids(started, "job-2") == [theirs.pid]
        assert local_rank_pids(started, "job-3") == []
    finally:
        end(ours)
        end(theirs)
