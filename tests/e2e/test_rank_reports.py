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
from helpers import HVDKIT, PYTHON, ROOT, hvdkit_run, run_bounded

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


# Each rank writes its parent's pid (its rank wrapper's) to FOLDER/wrapper.RANK, then waits.
WRITE_WRAPPER_PID = (
    "import os, sys, time; d, r = sys.argv[1], os.environ['OMPI_COMM_WORLD_RANK']; "
    "open(os.path.join(d, f'.wrapper.{r}'), 'w').write(str(os.getppid())); "
    "os.rename(os.path.join(d, f'.wrapper.{r}'), os.path.join(d, f'wrapper.{r}')); time.sleep(300)"
)


def test_a_rank_whose_own_wrapper_is_sigkilled_is_named_with_the_signal(tmp_path):
    # The wrapper reports how its rank ended; killed itself it reports nothing, and hvdkit run said
    # only "the launcher exited with 137 before any rank reported a failure" (issue 35, item 18),
    # although mpirun's own message names the rank.
    proc = subprocess.Popen(
        [HVDKIT, "run", "-np", "2", "--", PYTHON, "-c", WRITE_WRAPPER_PID, str(tmp_path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
        cwd=ROOT,
        start_new_session=True,
    )
    try:
        marker = tmp_path / "wrapper.1"
        deadline = time.monotonic() + 120
        while not marker.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert marker.exists(), "rank 1 never started"
        wrapper = int(marker.read_text())
        with open(f"/proc/{wrapper}/cmdline", "rb") as f:
            assert b"hvdkit.launcher.rankwrap" in f.read()  # rank 1's wrapper, not its command
        os.kill(wrapper, signal.SIGKILL)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 128 + signal.SIGKILL, err[-3000:]
    summary = [line for line in err.splitlines() if line.startswith("hvdkit run: rank ")]
    assert len(summary) == 1, err[-3000:]
    host = socket.gethostname().split(".")[0]  # as Open MPI names it
    assert summary[0].startswith(f"hvdkit run: rank 1 was killed by SIGKILL on {host}"), summary
    assert summary[0].endswith(
        "(mpirun says so; the rank's wrapper ended before it could report); job stopped (exit code 137)"
    ), summary
