"""Per-rank wrapper started by ``hvdkit run``: runs the user's command and reports how it ended.

    python -m hvdkit.launcher.rankwrap -- python train.py ...

The wrapper reports on its own stderr, which mpirun and horovodrun carry back to the launcher from
every host: one line when it starts (its pid and host) and one when the command ends (exit code or
signal), each ``hvdkit-rank JOB {json}`` with the job id from HVDKIT_JOB_ID. So the launcher names
the rank that failed first on any host, and no rank writes a file anywhere. The pid lets a
launcher on the same host signal the rank directly (SIGTERM for preemption, SIGKILL for clean-up):
mpirun puts ranks in their own process groups and kills them 1 s after a SIGTERM.

Signals are passed on to the command. The job never outlives its launcher: the command is killed
if the wrapper dies, the wrapper if its own parent (mpirun, its daemon, horovodrun's shell) does,
and the command as soon as nobody reads the wrapper's output any more (its stdout or stderr hung
up: whoever read it, mpirun or ssh, is gone).

Env: HVDKIT_JOB_ID (reports are made only when it is set), the launcher's rank variables.
"""

from __future__ import annotations

import ctypes
import json
import os
import select
import signal
import socket
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

from ..core import env as _env
from ..core.topology import from_env

__all__ = ["MARK", "report_line", "main"]

MARK = "hvdkit-rank"
_FORWARD = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2)
_PR_SET_PDEATHSIG = 1
_HUNG_UP = select.POLLERR | select.POLLHUP | select.POLLNVAL


def _find_prctl():
    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):  # not Linux: no parent-death signal, the other guards remain
        return None


_prctl = _find_prctl()  # looked up now: a child between fork and exec must not load libraries


def die_with_parent(sig: int = signal.SIGKILL) -> None:
    """Ask the kernel to send ``sig`` to this process when the thread that started it ends."""
    if _prctl is not None:
        _prctl(_PR_SET_PDEATHSIG, int(sig))


def report_line(job: str, record: Mapping[str, Any]) -> str:
    """The line a wrapper writes to tell the launcher of job ``job`` about ``record``."""
    return f"{MARK} {job} {json.dumps(record, sort_keys=True)}\n"


def _report(job: str, record: Mapping[str, Any]) -> None:
    try:  # one write: whole, never interleaved with another process's output on the same pipe
        os.write(2, report_line(job, record).encode())
    except OSError:  # nobody reads it any more: the launcher is gone
        pass


def _watched_fds():
    """stdout/stderr when they lead to a reader that can go away (pipe, socket, terminal)."""
    fds = []
    for fd in (1, 2):
        try:
            mode = os.fstat(fd).st_mode
        except OSError:
            continue
        if stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode) or os.isatty(fd):
            fds.append(fd)
    return fds


def _kill_when_unread(child, fds):
    """Kill ``child`` once one of ``fds`` hangs up: its reader (launcher, mpirun, ssh) is gone."""
    poller = select.poll()
    for fd in fds:
        poller.register(fd, 0)  # no events asked: poll reports only errors and hang-ups
    while not any(events & _HUNG_UP for _, events in poller.poll()):
        pass
    child.kill()


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--"]:
        argv = argv[1:]
    if not argv:
        sys.stderr.write("usage: python -m hvdkit.launcher.rankwrap -- COMMAND [ARGS...]\n")
        return 2
    started = time.time()
    ppid = os.getppid()
    die_with_parent()
    if os.getppid() != ppid:  # the parent died before the request took effect
        return 137
    job = os.environ.get(_env.JOB_ID)
    rank, host = from_env().rank, socket.gethostname()
    if job:
        _report(job, {"event": "start", "rank": rank, "pid": os.getpid(), "host": host})
    try:
        child = subprocess.Popen(argv, preexec_fn=die_with_parent)
    except OSError as e:
        sys.stderr.write(f"hvdkit: cannot start {argv[0]!r}: {e}\n")
        returncode = 127
    else:
        for sig in _FORWARD:
            signal.signal(sig, lambda signum, _frame: child.send_signal(signum))
        fds = _watched_fds()
        if fds:
            threading.Thread(target=_kill_when_unread, args=(child, fds), daemon=True).start()
        returncode = child.wait()
    if job:
        _report(
            job,
            {
                "event": "exit",
                "rank": rank,
                "exit_code": returncode if returncode >= 0 else None,
                "signal": -returncode if returncode < 0 else None,
                "seconds": time.time() - started,
                "host": host,
                "pid": os.getpid(),
            },
        )
    return returncode if returncode >= 0 else 128 - returncode


if __name__ == "__main__":
    sys.exit(main())
