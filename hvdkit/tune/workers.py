"""Which ``hvdkit tune`` worker runs a trial, and what to do with the trials of a worker that is gone.

Every trial a driver starts carries ``hvdkit_worker`` = ``HOST:PID`` of that driver and
``hvdkit_worker_process``: the kernel's boot id, the inode of the driver's PID namespace and its start
time (``WorkerId``). Workers on one study count each other's RUNNING trials as taken; a worker killed
with SIGKILL (or whose machine died) cannot end its trials, so they would stay taken for ever. A
driver that starts ends those whose worker surely is gone (``is_gone``: same host, same boot, same
PID namespace, and its pid names no process or one that started at another time) and whose job
(``hvdkit_job``: the process group of the trial's ``hvdkit run``) has ended too: FAIL, and their
parameters enqueued again (same key and attempt, so the rerun resumes in the same trial folder). A
job that outlived its worker is left RUNNING (a rerun would share its checkpoint folder) and named.
Trials of workers on other hosts, or in another PID namespace of this host (another container with
the same host name), are left alone: their pids mean nothing here, and nothing here can tell whether
they still run. Imports nothing of Optuna itself.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from .results import ATTEMPT_ATTR, KEY_ATTR

__all__ = [
    "WORKER_ATTR",
    "PROCESS_ATTR",
    "JOB_ATTR",
    "WorkerId",
    "this_worker",
    "worker_of",
    "process_start",
    "is_gone",
    "requeue_dead_local",
]

WORKER_ATTR = "hvdkit_worker"  # "HOST:PID" of the hvdkit tune process that runs the trial
PROCESS_ATTR = "hvdkit_worker_process"  # {"boot", "pidns", "start"} of that process (see WorkerId)
JOB_ATTR = "hvdkit_job"  # the process group id of the trial's hvdkit run (on the worker's host)


@dataclass(frozen=True)
class WorkerId:
    """An ``hvdkit tune`` process: its host name and pid, and what tells apart two processes with the
    same ones: ``boot`` (the kernel's boot id: two machines may share a host name), ``pidns`` (the inode
    of its PID namespace: two containers on one host may share a host name and a pid) and ``start``
    (its start time in clock ticks after boot: a pid is reused). ``""``/``0``: unknown (no /proc, or a
    trial of an hvdkit that did not record them)."""

    host: str
    pid: int
    boot: str = ""
    pidns: int = 0
    start: int = 0

    @property
    def name(self) -> str:
        """``HOST:PID``, as messages show the worker."""
        return f"{self.host}:{self.pid}"

    def attrs(self) -> dict[str, Any]:
        """The trial user attributes that record this worker (``worker_of`` reads them back)."""
        return {WORKER_ATTR: self.name, PROCESS_ATTR: {"boot": self.boot, "pidns": self.pidns, "start": self.start}}


def this_worker() -> WorkerId:
    """The ``WorkerId`` of this process."""
    pid = os.getpid()
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
        pidns = os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        boot, pidns = "", 0
    return WorkerId(socket.gethostname(), pid, boot, pidns, process_start(pid) or 0)


def worker_of(attrs: Mapping[str, Any]) -> WorkerId | None:
    """The worker a trial's user attributes ``attrs`` record; None if they record none."""
    host, _, pid = str(attrs.get(WORKER_ATTR, "")).rpartition(":")
    if not host or not pid.isdigit():
        return None
    proc = attrs.get(PROCESS_ATTR)
    proc = proc if isinstance(proc, Mapping) else {}
    return WorkerId(host, int(pid), str(proc.get("boot", "")), _count(proc.get("pidns")), _count(proc.get("start")))


def _count(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def process_start(pid: int) -> int | None:
    """When process ``pid`` of this PID namespace started (clock ticks after boot: field 22 of
    /proc/PID/stat); None when no process has that pid (a zombie counts as ended), 0 when one has
    it but there is no /proc to tell when it started."""
    if not os.path.exists("/proc/self/stat"):
        return 0 if _alive(pid, group=False) else None
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read().decode(errors="replace")
    except OSError:
        return None
    fields = stat.rpartition(")")[2].split()  # after the name, which may hold spaces and parentheses
    if len(fields) < 20 or fields[0] == "Z":
        return None
    return int(fields[19])


def is_gone(worker: WorkerId, here: WorkerId, start_of: Callable[[int], int | None] = process_start) -> bool:
    """True when ``worker`` has surely ended, as the process ``here`` sees it: it ran on this host (same
    host name and boot) in this PID namespace, and its pid names no process (``start_of`` gives None)
    or one that started at another time (the pid was reused). A worker in another PID namespace or on
    another machine is never judged gone. A record without namespace and start time (an hvdkit that
    did not record them) is judged by host name and pid alone."""
    if worker.host != here.host:
        return False
    recorded = bool(worker.pidns and worker.start)
    if recorded and (worker.pidns != here.pidns or worker.boot != here.boot):
        return False
    if not recorded and worker.pid == here.pid:
        return False
    start = start_of(worker.pid)
    if start is None:
        return True
    return recorded and start != 0 and start != worker.start


def _alive(pid: int, group: bool) -> bool:
    try:
        (os.killpg if group else os.kill)(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, another user's
        return True
    return True


def requeue_dead_local(study: Any, fail_state: Any, here: WorkerId | None = None) -> list[str]:
    """End the RUNNING trials of ``study`` whose worker is gone (``is_gone``, seen from ``here``: this
    process by default), and whose job has ended: each is told ``fail_state`` and its parameters are
    enqueued again. Returns a line for each trial of a gone worker (requeued, or left RUNNING because
    its job still runs)."""
    here = here or this_worker()
    lines = []
    for t in study.get_trials(deepcopy=False):
        worker = worker_of(t.user_attrs)
        if t.state.name != "RUNNING" or worker is None or not is_gone(worker, here):
            continue
        job = t.user_attrs.get(JOB_ATTR)
        if isinstance(job, int) and _alive(job, group=True):
            lines.append(
                f"trial {t.number}: its worker {worker.name} is gone but its job (process group {job}) still runs; "
                f"left RUNNING: end it (kill -TERM -{job}) and run again to rerun its parameters"
            )
            continue
        study.tell(t.number, state=fail_state)
        attrs = {k: t.user_attrs[k] for k in (KEY_ATTR, ATTEMPT_ATTR) if k in t.user_attrs}
        study.enqueue_trial(dict(t.params), user_attrs=attrs)
        lines.append(
            f"trial {t.number} was RUNNING in worker {worker.name}, which is gone: recorded FAIL, parameters queued"
        )
    return lines
