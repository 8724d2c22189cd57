"""Per-rank wrapper started by ``hvdkit run``: runs the user's command and records how it ended.

    python -m hvdkit.launch.rankwrap -- python train.py ...

The record (``rank-N.json`` in HVDKIT_STATUS_DIR: exit code, signal, time, host) lets the launcher
name the rank that failed first, for mpirun and horovodrun alike. ``rank-N.pid`` lets a launcher on
the same host signal the rank directly (SIGTERM for preemption, SIGKILL for clean-up): mpirun puts
ranks in their own process groups and kills them 1 s after a SIGTERM. Signals are passed on to the
command; the command is killed if the wrapper dies, and the wrapper if its own parent does.
"""

import ctypes
import json
import os
import signal
import socket
import subprocess
import sys
import time

from ..core import env as _env
from ..core.topology import from_env

_FORWARD = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2)
_PR_SET_PDEATHSIG = 1


def _die_with_parent():
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        pass


def _write_atomic(status_dir, name, text):
    tmp = os.path.join(status_dir, f".{name}.tmp")
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, os.path.join(status_dir, name))


def _register(status_dir, rank):
    try:
        _write_atomic(status_dir, f"rank-{rank}.pid", f"{os.getpid()} {socket.gethostname()}\n")
    except OSError:  # a rank on another host: its launcher-side folder is not here
        pass


def _record(status_dir, rank, returncode, started):
    record = {
        "rank": rank,
        "exit_code": returncode if returncode >= 0 else None,
        "signal": -returncode if returncode < 0 else None,
        "ended": time.time(),
        "seconds": time.time() - started,
        "host": socket.gethostname(),
        "pid": os.getpid(),
    }
    _write_atomic(status_dir, f"rank-{rank}.json", json.dumps(record))


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--"]:
        argv = argv[1:]
    if not argv:
        sys.stderr.write("usage: python -m hvdkit.launch.rankwrap -- COMMAND [ARGS...]\n")
        return 2
    started = time.time()
    ppid = os.getppid()
    _die_with_parent()
    if os.getppid() != ppid:  # the parent died before the request took effect
        return 137
    status_dir = os.environ.get(_env.STATUS_DIR)
    rank = from_env().rank
    if status_dir:
        _register(status_dir, rank)
    try:
        child = subprocess.Popen(argv, preexec_fn=_die_with_parent)
    except OSError as e:
        sys.stderr.write(f"hvdkit: cannot start {argv[0]!r}: {e}\n")
        returncode = 127
    else:
        for sig in _FORWARD:
            signal.signal(sig, lambda signum, _frame: child.send_signal(signum))
        returncode = child.wait()
    if status_dir:
        try:
            _record(status_dir, rank, returncode, started)
        except OSError as e:  # the record is a courtesy; never mask the command's own result
            sys.stderr.write(f"hvdkit: could not record the exit status in {status_dir}: {e}\n")
    return returncode if returncode >= 0 else 128 - returncode


if __name__ == "__main__":
    sys.exit(main())
