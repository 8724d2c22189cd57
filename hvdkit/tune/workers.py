"""Which ``hvdkit tune`` worker runs a trial, and what to do with the trials of a worker that is gone.

Every trial a driver starts carries ``hvdkit_worker`` = ``HOST:PID`` of that driver. Workers on one
study count each other's RUNNING trials as taken; a worker killed with SIGKILL (or whose machine
died) cannot end its trials, so they would stay taken for ever. A driver that starts on the same
host ends those whose worker process is gone and whose job (``hvdkit_job``: the process group of
the trial's ``hvdkit run``) has ended too: FAIL, and their parameters enqueued again (same key and
attempt, so the rerun resumes in the same trial folder). A job that outlived its worker is left
RUNNING (a rerun would share its checkpoint folder) and named. Trials of workers on other hosts are
left alone: nothing here can tell whether they still run. Imports nothing of Optuna itself.
"""

from __future__ import annotations

import os
import socket
from typing import Any

from .results import ATTEMPT_ATTR, KEY_ATTR

__all__ = ["WORKER_ATTR", "JOB_ATTR", "this_worker", "requeue_dead_local"]

WORKER_ATTR = "hvdkit_worker"  # "HOST:PID" of the hvdkit tune process that runs the trial
JOB_ATTR = "hvdkit_job"  # the process group id of the trial's hvdkit run (on the worker's host)


def this_worker() -> str:
    """``HOST:PID`` of this process."""
    return f"{socket.gethostname()}:{os.getpid()}"


def _gone(worker: str) -> bool:
    host, _, pid = worker.rpartition(":")
    if host != socket.gethostname() or not pid.isdigit() or int(pid) == os.getpid():
        return False
    return not _alive(int(pid), group=False)


def _alive(pid: int, group: bool) -> bool:
    try:
        (os.killpg if group else os.kill)(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, another user's
        return True
    return True


def requeue_dead_local(study: Any, fail_state: Any) -> list[str]:
    """End the RUNNING trials of ``study`` whose worker ran on this host and is gone, and whose job
    has ended: each is told ``fail_state`` and its parameters are enqueued again. Returns a line for
    each trial of a gone worker (requeued, or left RUNNING because its job still runs)."""
    lines = []
    for t in study.get_trials(deepcopy=False):
        worker = t.user_attrs.get(WORKER_ATTR, "")
        if t.state.name != "RUNNING" or not worker or not _gone(worker):
            continue
        job = t.user_attrs.get(JOB_ATTR)
        if isinstance(job, int) and _alive(job, group=True):
            lines.append(
                f"trial {t.number}: its worker {worker} is gone but its job (process group {job}) still runs; "
                f"left RUNNING: end it (kill -TERM -{job}) and run again to rerun its parameters"
            )
            continue
        study.tell(t.number, state=fail_state)
        attrs = {k: t.user_attrs[k] for k in (KEY_ATTR, ATTEMPT_ATTR) if k in t.user_attrs}
        study.enqueue_trial(dict(t.params), user_attrs=attrs)
        lines.append(
            f"trial {t.number} was RUNNING in worker {worker}, which is gone: recorded FAIL, parameters queued"
        )
    return lines
