"""Which processes of a job get which signal: rank wrappers on this host (by the pids they reported,
checked against /proc), Horovod elastic workers on this host (found below their driver), ranks on other
hosts (over ssh, by host and pid), and what a job left behind."""

from __future__ import annotations

import os
import shlex
import signal
import socket
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from ..core import env as _env

__all__ = [
    "local_rank_pids",
    "elastic_worker_pids",
    "remote_rank_pids",
    "remote_ranks_to_stop",
    "remote_term_command",
    "signal_remote",
    "signal_pids",
    "process_tree",
    "reap",
]


def local_rank_pids(started: Mapping[int, Mapping[str, Any]], job_id: str | None, host: str | None = None) -> list[int]:
    """Pids of this job's rank wrappers on this host that are still running, from their start reports.

    A pid counts only if its report names this host and the process with that pid here is a rank
    wrapper started for ``job_id`` (its HVDKIT_JOB_ID): never a rank of another job, a pid of
    another host, or a pid reused since.
    """
    host = host or socket.gethostname()
    return [
        rec["pid"]
        for rec in started.values()
        if rec.get("host") == host and isinstance(rec.get("pid"), int) and _is_wrapper_of(rec["pid"], job_id)
    ]


def _is_wrapper_of(pid, job_id):
    if pid <= 1 or not job_id:
        return False
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            if b"hvdkit.launcher.rankwrap" not in f.read():
                return False
        with open(f"/proc/{pid}/environ", "rb") as f:  # readable for our own processes (and root)
            return f"{_env.JOB_ID}={job_id}".encode() in f.read().split(b"\0")
    except OSError:
        return False


# Set by Horovod's driver for each worker it starts, in the worker's environment only (not in its own or its
# middlemen's): the workers' rendezvous with the driver.
_WORKER_VARIABLE = b"HOROVOD_GLOO_RENDEZVOUS_PORT="


def elastic_worker_pids(driver_pid: int) -> list[int]:
    """Pids of the workers Horovod's elastic driver (horovodrun, pid ``driver_pid``) runs on this host: below it,
    the worker's command, the topmost process with the worker environment that is not the ``/bin/sh -c`` Horovod
    runs it with (a signal to that shell ends the shell, not the command). Not what the command started, nor the
    middleman process Horovod starts each worker from, nor the ssh client of a worker on another host."""
    below = process_tree(driver_pid)[1:]
    parents = {pid: _parent(pid) for pid in below}
    workers = {pid for pid in below if _has_worker_environment(pid)}
    shells = {pid for pid in workers if parents[pid] not in workers and _is_shell(pid)}
    return [pid for pid in below if pid in workers - shells and (parents[pid] not in workers or parents[pid] in shells)]


def _has_worker_environment(pid):
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:  # readable for our own processes (and root)
            return any(item.startswith(_WORKER_VARIABLE) for item in f.read().split(b"\0"))
    except OSError:
        return False


def _is_shell(pid):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().split(b"\0")[:2] == [b"/bin/sh", b"-c"]
    except OSError:
        return False


def _parent(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return None


def remote_rank_pids(started: Mapping[int, Mapping[str, Any]], host: str | None = None) -> list[tuple[str, int]]:
    """``[(host, pid)]`` of this job's rank wrappers on other hosts, by rank, from their start reports."""
    host = host or socket.gethostname()
    return [
        (rec["host"], rec["pid"])
        for _, rec in sorted(started.items())
        if rec.get("host") not in (None, host) and isinstance(rec.get("pid"), int) and rec["pid"] > 1
    ]


def remote_ranks_to_stop(
    remote: Sequence[tuple[str, int]], local: Sequence[int], guarded: bool
) -> list[tuple[str, int]]:
    """Which remote ranks (``[(host, pid)]``, by rank) a graceful stop signals over ssh.

    Ranks that train under a PreemptionGuard (``guarded``) stop together once any one of them got the
    signal (its check is a collective): then the local ranks' signal is enough, or, with no rank on
    this host, the first remote one. Signalling more would race: ssh delivers late and unevenly, and
    a rank that already stopped and is exiting dies of the signal instead of exiting cleanly.
    Unguarded ranks all get it (their default action ends them)."""
    if not guarded:
        return list(remote)
    return [] if local else list(remote[:1])


def remote_term_command(pid: int, job_id: str) -> str:
    """The shell command that sends SIGTERM to ``pid`` on its host if, and only if, it is a rank
    wrapper of ``job_id`` (its environment holds HVDKIT_JOB_ID=``job_id``): never a reused pid."""
    return (
        f"tr '\\0' '\\n' < /proc/{int(pid)}/environ 2>/dev/null | grep -qxF {shlex.quote(f'{_env.JOB_ID}={job_id}')} "
        f"&& kill -TERM {int(pid)}"
    )


def signal_one_remote(
    workers: Sequence[tuple[str, int]],
    job_id: str | None,
    ssh: Callable[[str, list[str], float], tuple[int, str]] | None = None,
) -> threading.Thread | None:
    """SIGTERM to one live process of ``workers`` (``[(host, pid)]``, the one to try first first) over ssh, in the
    background: host by host, each host's pids in one command that stops at the first one still of ``job_id``.
    For the workers of Horovod's elastic driver (``--recovery in-process``), which train under a PreemptionGuard:
    one that hears of the stop tells the others at their next step, and a killed worker's pid may be listed."""
    if not workers or not job_id:
        return None
    from .remote import ssh as remote_ssh

    run_ssh = ssh or remote_ssh
    hosts: dict[str, list[int]] = {}
    for host, pid in workers:
        hosts.setdefault(host, []).append(pid)

    def send():
        for host, pids in hosts.items():
            command = " || ".join(f"({remote_term_command(pid, job_id)})" for pid in pids)
            code, _ = run_ssh(host, ["sh", "-c", shlex.quote(command)], 15)
            if code == 0:
                return

    thread = threading.Thread(target=send, daemon=True)
    thread.start()
    return thread


def signal_remote(
    ranks: Sequence[tuple[str, int]],
    job_id: str | None,
    ssh: Callable[[str, list[str], float], tuple[int, str]] | None = None,
) -> threading.Thread | None:
    """SIGTERM to each rank wrapper of ``ranks`` (``[(host, pid)]``) over ssh, all hosts at once, in the
    background: horovodrun passes no signal on, so under Gloo this is how ranks on other hosts hear of
    a stop (mpirun passes SIGUSR1 on instead). The wrapper passes it to its command."""
    if not ranks or not job_id:
        return None
    from .remote import ssh as remote_ssh

    run_ssh = ssh or remote_ssh

    def send():
        for host, pid in ranks:
            threading.Thread(
                target=run_ssh,
                args=(host, ["sh", "-c", shlex.quote(remote_term_command(pid, job_id))], 15),
                daemon=True,
            ).start()

    thread = threading.Thread(target=send, daemon=True)
    thread.start()
    return thread


def signal_pids(pids: Iterable[int], sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def process_tree(pid: int) -> list[int]:
    """``pid`` and every process below it (ssh clients run in sessions of their own), from /proc."""
    children = {}
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    found, todo = [], [pid]
    while todo:
        found.append(todo.pop())
        todo += children.get(found[-1], [])
    return found


def reap(pgid: int, rank_pids: Iterable[int]) -> None:
    """Kill whatever the job left behind on this host: the launcher's group and any rank wrapper
    still running (their commands die with them)."""
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    signal_pids(rank_pids, signal.SIGKILL)
