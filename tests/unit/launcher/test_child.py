"""The one child-process helper (hvdkit.launcher.child), with real child processes."""

import os
import subprocess
import sys

import pytest
from helpers import pid_running, wait_until_gone

from hvdkit.launcher.child import Child, run_child

PY = sys.executable

# Starts a grandchild in the same process group that writes its pid, then both sleep: a timeout must end both.
_FAMILY = """
import os, subprocess, sys, time
kid = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
print("leader", os.getpid(), flush=True)
print("grandchild", kid.pid, flush=True)
time.sleep(300)
"""

# Ignores SIGTERM and says so: only the SIGKILL after the grace period ends it.
_STUBBORN = """
import signal, time
signal.signal(signal.SIGTERM, lambda *a: print("term ignored", flush=True))
print("ready", flush=True)
time.sleep(300)
"""

# Ends cleanly on SIGTERM, saying so first.
_POLITE = """
import signal, sys, time
def bye(*a):
    print("stopping cleanly", flush=True)
    sys.exit(7)
signal.signal(signal.SIGTERM, bye)
print("ready", flush=True)
time.sleep(300)
"""


def _signal_state(pid):
    """The lines of /proc/<pid>/status that say whether and how a process takes signals."""
    try:
        with open(f"/proc/{pid}/status") as f:
            return "; ".join(line.strip() for line in f if line.startswith(("State", "Sig", "ShdPnd")))
    except OSError as e:
        return f"unreadable ({e})"


def _pids(output):
    return {
        line.split()[0]: int(line.split()[1])
        for line in output.splitlines()
        if line.split()[0] in ("leader", "grandchild")
    }


def test_output_lines_arrive_in_order_with_stderr_merged_and_the_exit_code_is_returned():
    seen = []
    code = "import sys\nfor i in range(200):\n    print(f'out {i}', flush=True)\n    if i % 50 == 0: print(f'err {i}', file=sys.stderr, flush=True)\nsys.exit(3)"
    result = run_child([PY, "-c", code], on_line=seen.append, timeout=60)
    expected = []
    for i in range(200):
        expected.append(f"out {i}\n")
        if i % 50 == 0:
            expected.append(f"err {i}\n")
    assert seen == expected
    assert result.output == "".join(expected)
    assert (result.exit_code, result.timed_out) == (3, False)


def test_the_child_gets_the_environment_given_and_runs_in_its_own_session():
    code = "import os; print(os.environ.get('CHILD_PROBE'), os.getsid(0) == os.getpid(), os.getpgid(0) == os.getpid())"
    result = run_child([PY, "-c", code], env={**os.environ, "CHILD_PROBE": "x42"}, timeout=60)
    assert result.output == "x42 True True\n"
    assert result.exit_code == 0


def test_a_timeout_ends_the_whole_process_group_leader_and_grandchild():
    result = run_child([PY, "-c", _FAMILY], timeout=3, grace=2)
    pids = _pids(result.output)
    assert sorted(pids) == ["grandchild", "leader"]
    assert result.timed_out is True
    assert result.exit_code == -15  # the leader ended by the SIGTERM, the first step of the graceful stop
    assert wait_until_gone(pids.values(), 10)[1] == []


def test_the_graceful_stop_lets_a_child_that_ends_on_sigterm_end_by_itself():
    child = Child([PY, "-c", _POLITE])
    lines = child.lines()
    assert next(lines) == "ready\n"
    assert child.stop(grace=30) == 7
    assert list(lines) == ["stopping cleanly\n"]
    assert child.stopped_at is not None


def test_the_graceful_stop_kills_a_child_that_ignores_sigterm_after_the_grace_period():
    child = Child([PY, "-c", _STUBBORN])
    lines = child.lines()
    assert next(lines) == "ready\n"
    assert child.stop(grace=1) == -9
    assert list(lines) == ["term ignored\n"]
    assert not pid_running(child.pid)


def test_output_to_a_file_and_terminate_of_the_leader_alone(tmp_path):
    log = tmp_path / "child.log"
    with open(log, "ab") as f:
        child = Child([PY, "-c", _POLITE], output=f)
    while "ready" not in log.read_text():
        assert child.poll() is None, log.read_text()
    child.terminate(group=False)
    try:
        code = child.wait(60)
    except subprocess.TimeoutExpired:
        state = _signal_state(child.pid)  # stopped (State T) or SIGTERM blocked: what held it
        child.kill()
        pytest.fail(
            f"the child did not end within 60 s of its SIGTERM; its state: {state}; its log: {log.read_text()!r}"
        )
    assert code == 7
    assert log.read_text() == "ready\nstopping cleanly\n"
    with pytest.raises(RuntimeError, match="goes to a file"):
        next(child.lines())


def test_a_command_that_is_not_there_raises_file_not_found():
    with pytest.raises(FileNotFoundError):
        run_child(["/nonexistent/hvdkit-no-such-tool"], timeout=5)
