"""Failures on another host, on two test hosts that share nothing under /tmp (as real machines).

A rank on the remote host that fails is named with its host and exit code, and `hvdkit run`
exits with that code; if the launcher dies, the remote ranks end too. Over MPI and over Gloo.
Needs root (namespaces, mounts).
"""

import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import pytest
from helpers import BIN, HVDKIT, PYTHON, ROOT, end_job, pid_running, record_figures, run_bounded, wait_until_gone
from netns import NEEDS_HOSTS, open_hosts
from other_user import read_as_nobody, where

pytestmark = [
    pytest.mark.dist,
    *NEEDS_HOSTS,
]
BEHAVE = str(ROOT / "tests" / "e2e" / "scripts" / "rank_behaviour.py")
RECORD_PIDS = str(ROOT / "tests" / "e2e" / "scripts" / "record_job_pids.py")
CONTROLLERS = {"mpi": [], "gloo": ["--gloo"]}


@pytest.fixture(scope="module")
def hosts():
    yield from open_hosts(private_tmp=True)


def _start_on_a(hosts, argv, env, shared_dir):
    """``argv`` started on host a, in a session of its own, its output in ``shared_dir/launcher.log``."""
    with open(shared_dir / "launcher.log", "w") as log:
        return subprocess.Popen(
            hosts.argv_on(0, argv),
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            cwd=ROOT,
            start_new_session=True,
        )


def _wait_for(files, proc, shared_dir, bound=240):
    """Until every one of ``files`` exists; fails with the launcher's output if it ends or ``bound`` s pass."""
    deadline = time.monotonic() + bound
    while not all(f.exists() for f in files):
        assert proc.poll() is None and time.monotonic() < deadline, (shared_dir / "launcher.log").read_text()
        time.sleep(0.2)


@pytest.fixture
def shared_dir():
    """A folder every host and the test see (a host's /tmp is its own)."""
    path = Path(tempfile.mkdtemp(prefix="hvdkit-remote-", dir="/var/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_each_test_host_has_a_tmp_of_its_own(hosts):
    b = hosts.names[1]
    mark = f"hvdkit-mark-{os.getpid()}"
    script = f"touch /tmp/{mark} && ls /tmp/{mark} && ssh {b} ls /tmp/{mark}"
    proc = run_bounded(hosts.argv_on(0, ["sh", "-c", script]), 60)
    assert proc.returncode != 0 and f"/tmp/{mark}" in proc.stdout  # written on a, absent on b
    assert not os.path.exists(f"/tmp/{mark}")


@pytest.mark.parametrize("controller", CONTROLLERS)
def test_a_failing_remote_rank_is_named_with_its_host_and_exit_code(hosts, controller):
    a, b = hosts.names
    argv = [
        HVDKIT,
        "run",
        "-np",
        "2",
        *CONTROLLERS[controller],
        "-H",
        f"{a}:1,{b}:1",
        "--network-interface",
        "hvd0",
        "--",
        PYTHON,
        BEHAVE,
        "exit",
        "1",
        "3",
    ]
    proc = run_bounded(hosts.argv_on(0, argv), 240)
    last = proc.stderr.strip().splitlines()[-1]
    record_figures(f"remote rank fails ({controller})", exit_code=proc.returncode, message=last)
    assert proc.returncode == 3, proc.stderr[-3000:]
    assert last.startswith(f"hvdkit run: rank 1 exited with code 3 on {b} after "), proc.stderr[-3000:]
    assert "[rank 1] rank 1 failing on purpose" in proc.stderr
    assert "could not record" not in proc.stderr


@pytest.mark.parametrize("controller", CONTROLLERS)
def test_ranks_on_the_remote_host_end_when_the_launcher_is_killed(hosts, shared_dir, controller):
    a, b = hosts.names
    env = dict(os.environ, PYTHONUNBUFFERED="1", PATH=f"{BIN}{os.pathsep}{os.environ['PATH']}")
    argv = [
        HVDKIT,
        "run",
        "-np",
        "2",
        *CONTROLLERS[controller],
        "-H",
        f"{a}:1,{b}:1",
        "--network-interface",
        "hvd0",
        "--",
        PYTHON,
        RECORD_PIDS,
        str(shared_dir),
        str(os.getpid()),
    ]
    proc = _start_on_a(hosts, argv, env, shared_dir)
    job = set()
    try:
        files = [shared_dir / f"rank-{r}.json" for r in (0, 1)]
        _wait_for(files, proc, shared_dir)
        local, remote = (json.loads(f.read_text()) for f in files)
        assert proc.pid in local["pids"] and not remote["reached_launcher"]  # rank 1 runs under sshd on b
        # rank 0, its wrapper and mpirun/horovodrun on a; rank 1 and its wrapper on b (above them
        # mpirun's daemon or a shell, then sshd)
        job = (set(local["pids"]) - {proc.pid}) | set(remote["pids"][:2])
        assert all(pid_running(pid) for pid in job)
        os.kill(proc.pid, signal.SIGKILL)  # `hvdkit run` itself (in_host.sh and unshare exec it)
        gone_after, left = wait_until_gone(job, 60)
        assert left == [], (shared_dir / "launcher.log").read_text()[-3000:]
    finally:
        end_job(job, proc)
        proc.wait()
    record_figures(f"launcher death, two hosts ({controller})", seconds_until_every_rank_gone=round(gone_after, 2))


@pytest.mark.parametrize("controller", CONTROLLERS)
def test_no_value_of_the_launching_shell_is_on_a_command_line_on_either_host(hosts, shared_dir, controller):
    """Engine fix 08: a rank on another host gets its environment on ssh's stdin (upstream put every
    variable on the ssh command line and on the remote shell's, readable by every user of both hosts)."""
    a, b = hosts.names
    token = "tok-" + os.urandom(16).hex()
    env = dict(os.environ, MY_API_TOKEN=token, PATH=f"{BIN}{os.pathsep}{os.environ['PATH']}")
    script = str(ROOT / "tests" / "e2e" / "scripts" / "wait_for_go.py")
    argv = [HVDKIT, "run", "-np", "2", *CONTROLLERS[controller], "-H", f"{a}:1,{b}:1", "--network-interface", "hvd0"]
    argv += ["--", PYTHON, script, str(shared_dir)]
    proc = _start_on_a(hosts, argv, env, shared_dir)
    try:
        _wait_for([shared_dir / f"ready.{r}" for r in (0, 1)], proc, shared_dir)
        seen = read_as_nobody()  # one PID namespace: both hosts' processes
        assert seen.count(script) >= 2  # both ranks' command lines were readable...
        assert token not in seen, where(seen, token)  # ...and the token is on none of them, nor on ssh's or a shell's
        (shared_dir / "go").touch()
        assert proc.wait(timeout=120) == 0, (shared_dir / "launcher.log").read_text()[-3000:]
    finally:
        (shared_dir / "go").touch()
        end_job([], proc)
