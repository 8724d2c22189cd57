"""One job per checkpoint folder: an exclusive ``flock`` held by rank 0 for the store's life.

Two jobs writing one folder destroy each other (each prunes the other's checkpoints and sweeps its
writes in progress), so rank 0 of a job takes ``fcntl.flock(LOCK_EX | LOCK_NB)`` on ``.hvdkit.lock``
in the folder and writes its host, pid and job id there. A second job fails at once with an error
naming the holder. The kernel drops the lock when the holder exits, however it ends (SIGKILL too),
so a stale lock file never blocks a new job. Stores of one process share the process's lock.

Under in-process recovery (``hvdkit run --recovery in-process``) the process that is rank 0 can change while
every process lives on: a worker that joins may be given rank 0. The process that held the lock gives it back at
the sync where it stops being rank 0, after its own write in flight (``CheckpointStore._step_down``), and the new
rank 0 waits for it (at most ``HANDOFF_WAIT`` seconds) when the holder is of its own job (the same lineage).

On shared storage (NFS) a lock can outlive a host that was lost: the server only drops it when its
lease ends, or never. An elastic job's attempts share a lineage (HVDKIT_LINEAGE, set by ``hvdkit
run``), written with the holder: an attempt that finds the lock held by its own lineage on another
host (the lost rank 0 of an earlier attempt) goes on without it, saying so, instead of failing
"in use" at every relaunch.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import socket
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field

from .. import env as _env
from ..errors import CheckpointError
from ..log import get_logger

__all__ = ["LOCK_FILE", "FolderLock", "acquire", "release"]

LOCK_FILE = ".hvdkit.lock"
_log = get_logger("checkpoint")
_HELD = {}  # (st_dev, st_ino) of a folder -> its FolderLock, held by this process
# Re-entrant: a store gives its lock back from a weakref finalizer, which the garbage collector may
# run inside acquire() or release() on this very thread, while the guard is held (a plain Lock hung).
_GUARD = threading.RLock()
_UNSUPPORTED = (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL)
HANDOFF_WAIT = 60.0  # in-process recovery: seconds the new rank 0 waits for the process of its job that was rank 0
_HANDOFF_POLL = 0.05


@dataclass
class FolderLock:
    """This process's hold on a folder. ``job`` goes into the names of its temporary entries."""

    key: tuple
    fd: int
    job: str
    locked: bool  # False where the file system has no flock (then nothing is exclusive)
    users: int = field(default=1)


def _holder(fd):
    try:
        text = os.pread(fd, 4096, 0).decode("utf-8", "replace")
        return json.loads(text) if text.strip() else {}
    except (OSError, ValueError):
        return {}


def _in_use(root, holder):
    since = holder.get("since")
    when = time.strftime(", since %Y-%m-%d %H:%M:%S UTC", time.gmtime(since)) if isinstance(since, (int, float)) else ""
    who = f"host {holder.get('host', '?')}, pid {holder.get('pid', '?')}, job {holder.get('job', '?')}{when}"
    command = f", running {holder['command']}" if holder.get("command") else ""
    return (
        f"checkpoint directory {root!r} is in use by another job: {who}{command}. Two jobs on one "
        "directory delete each other's checkpoints; give this job its own directory (--checkpoint-dir), "
        f"or end that job first (pid {holder.get('pid', '?')} on {holder.get('host', '?')}); "
        "the lock is released when it exits"
    )


def acquire(root: str) -> FolderLock:
    """This process's exclusive lock on the folder ``root`` (rank 0 only; no collective).

    Raises CheckpointError naming the holder (host, pid, job) when another process holds it, and
    OSError when the lock file cannot be created. Stores of one process on one folder share a lock;
    each ``acquire`` needs a ``release``.
    """
    st = os.stat(root)
    key = (st.st_dev, st.st_ino)
    with _GUARD:
        held = _HELD.get(key)
        if held is not None:
            held.users += 1
            return held
        fd = os.open(os.path.join(root, LOCK_FILE), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o644)
        try:
            locked = _flock(fd, root)
            held = FolderLock(key, fd, uuid.uuid4().hex[:8], locked)
            if locked:
                _write_holder(fd, held.job)
        except BaseException:
            os.close(fd)
            raise
        _HELD[key] = held
        return held


def _flock(fd, root):
    try:
        _flock_or_wait_for_handoff(fd, root)
    except BlockingIOError:
        holder = _holder(fd)
        lineage = os.environ.get(_env.LINEAGE, "")
        if lineage and holder.get("lineage") == lineage and holder.get("host") != socket.gethostname():
            _log.warning(
                "%s: the lock is still held for host %s (pid %s), an earlier attempt of this same elastic job; "
                "its host is gone but the file system kept the lock. Going on without it: make sure nothing "
                "runs there any more",
                root,
                holder.get("host", "?"),
                holder.get("pid", "?"),
            )
            return False
        if _handing_off(holder):
            raise CheckpointError(
                f"checkpoint directory {root!r}: process {holder.get('pid', '?')} on {holder.get('host', '?')}, rank 0 "
                f"of this job before this process, did not give back the folder's lock within {HANDOFF_WAIT:g} s; "
                "its write may hang (look at that process), or end the job and start it again from the newest "
                "checkpoint"
            ) from None
        raise CheckpointError(_in_use(root, holder)) from None
    except OSError as e:
        if e.errno not in _UNSUPPORTED:
            raise
        _log.warning("%s: this file system has no flock (%s); nothing stops a second job from using it", root, e)
        return False
    return True


def _handing_off(holder):
    """Whether ``holder`` is a process of this very job under in-process recovery (the rank 0 before this one,
    which gives the lock back at its next sync)."""
    lineage = os.environ.get(_env.LINEAGE, "")
    return bool(lineage) and holder.get("lineage") == lineage and os.environ.get(_env.RECOVERY) == "in-process"


def _flock_or_wait_for_handoff(fd, root):
    """``flock(LOCK_EX | LOCK_NB)``; while the holder is the rank 0 before this process in the same in-process job,
    try again for at most ``HANDOFF_WAIT`` seconds (BlockingIOError after that, as at once for anyone else)."""
    deadline = None
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            holder = _holder(fd)
            if not _handing_off(holder):
                raise
            now = time.monotonic()
            if deadline is None:
                deadline = now + HANDOFF_WAIT
                _log.info(
                    "%s: waiting for process %s on %s, rank 0 before this process, to give back the folder's lock "
                    "(at most %g s)",
                    root,
                    holder.get("pid", "?"),
                    holder.get("host", "?"),
                    HANDOFF_WAIT,
                )
            elif now >= deadline:
                raise
            time.sleep(_HANDOFF_POLL)


def _write_holder(fd, job):
    info = {
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "job": job,
        "since": time.time(),
        "command": " ".join(sys.argv)[:300],
        "lineage": os.environ.get(_env.LINEAGE, ""),
    }
    os.ftruncate(fd, 0)
    os.pwrite(fd, (json.dumps(info) + "\n").encode(), 0)


def release(held: FolderLock) -> None:
    """Give back one ``acquire``; the last one closes the file, which drops the lock."""
    with _GUARD:
        held.users -= 1
        if held.users > 0:
            return
        if _HELD.get(held.key) is held:
            del _HELD[held.key]
        os.close(held.fd)
