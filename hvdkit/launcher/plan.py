"""Turn a JobSpec into the exact argv and environment to start it. Pure: starts nothing."""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from ..core import env as _env
from .hosts import Host, format_hosts, is_local, total_slots
from .spec import JobSpec
from .timeline_flags import MARK_CYCLES, TIMELINE

__all__ = [
    "Plan",
    "build",
    "default_num_proc",
    "find_tool",
    "keeps_prefix",
    "oversubscribed",
    "resolve_program",
    "FORWARDED",
    "FORWARDED_PREFIXES",
    "NCCL_SOCKET_IFNAME",
    "SYSTEM_BIN",
]

# The launcher's own values of these reach ranks on other hosts (mpirun -x NAME), when set.
FORWARDED = ("PATH", "LD_LIBRARY_PATH", "PYTHONPATH")
# Variables whose names start so reach every rank (mpirun -x NAME), when set in the launcher's environment,
# as horovodrun passes its environment on: each rank reads its own NCCL settings (NCCL_DEBUG,
# NCCL_SOCKET_IFNAME, NCCL_IB_HCA, ...), Horovod's (HOROVOD_FUSION_THRESHOLD, HOROVOD_CYCLE_TIME, ...)
# and hvdkit's (HVDKIT_NUM_THREADS, HVDKIT_COMPRESSION, ...); Open MPI sends none of them to other hosts.
FORWARDED_PREFIXES = ("NCCL_", "HOROVOD_", "HVDKIT_")
# ... except a process's place in a job, which a launcher sets for each rank (a launcher started from
# inside another job's rank must not hand its own rank to all of its ranks).
NOT_FORWARDED = frozenset(
    f"HOROVOD_{name}"
    for name in (
        "RANK",
        "SIZE",
        "LOCAL_RANK",
        "LOCAL_SIZE",
        "CROSS_RANK",
        "CROSS_SIZE",
        "HOSTNAME",
        "GLOO_RENDEZVOUS_ADDR",
        "GLOO_RENDEZVOUS_PORT",
        "GLOO_IFACE",
    )
)
NCCL_SOCKET_IFNAME = "NCCL_SOCKET_IFNAME"
# Folders on every login shell's PATH: an mpirun here finds its orted on every host without a prefix.
SYSTEM_BIN = frozenset({"/bin", "/usr/bin", "/usr/local/bin"})


@dataclass(frozen=True)
class Plan:
    """An argv list and the variables to add to the launcher's environment."""

    argv: tuple
    env: dict

    def full_env(self, base: Mapping[str, str] | None = None) -> dict[str, str]:
        merged = dict(os.environ if base is None else base)
        merged.update(self.env)
        return merged


def find_tool(name: str, python: str) -> str:
    """``name`` next to ``python`` (the virtualenv's copy) if there, else from PATH, else bare."""
    beside = os.path.join(os.path.dirname(python), name)
    return beside if os.access(beside, os.X_OK) else (shutil.which(name) or name)


def resolve_program(command: Sequence[str], path: str | None) -> tuple[str, ...]:
    """``command`` with a bare program name (``python3``) made the absolute path that ``path`` finds.

    Every rank then runs the program the launching shell would (its virtualenv's python), whatever
    PATH the rank gets from the MPI launcher. The path is absolute but not resolved: a virtualenv's
    ``python`` is a link whose own path selects the virtualenv. A name ``path`` does not find stays as is.
    """
    if not command or os.sep in command[0]:
        return tuple(command)
    found = shutil.which(command[0], path=path)
    return (os.path.abspath(found), *command[1:]) if found else tuple(command)


def keeps_prefix(mpirun: str, local: bool) -> bool:
    """Whether ``mpirun`` may keep the ``--prefix`` that Open MPI's mpirun assumes when named by a full
    path (its folder's parent): False (give it ``--noprefix``) for a job on this machine only, or for
    an mpirun by path in a system folder (``SYSTEM_BIN``); True for one elsewhere across hosts, and
    for a bare ``mpirun`` (no prefix assumed).

    The prefix puts ``PREFIX/bin`` first on every rank's PATH, ahead even of a PATH passed with ``-x``
    (mpirun prepends it again), so with /usr/bin/mpirun the ranks' ``python3`` is the system's, not the
    launching shell's virtualenv's. Its one use is finding ``orted`` on other hosts, which a system
    folder needs no prefix for; an mpirun elsewhere (/opt/openmpi/bin) keeps it across hosts.
    """
    if local:
        return False
    return not (os.path.isabs(mpirun) and os.path.dirname(os.path.normpath(mpirun)) in SYSTEM_BIN)


def oversubscribed(num_proc: int, cores: int) -> str:
    """What running ``num_proc`` ranks on this host's ``cores`` means, in one line."""
    return (
        f"{num_proc} ranks on {cores} CPU cores here: they share cores (mpirun --oversubscribe), one thread "
        f"each, so steps run slower than on {num_proc} cores; use -np {cores} or add hosts (-H) to avoid it"
    )


def default_num_proc(hosts: Sequence[Host], cores: int, gpus: int) -> tuple[int, str]:
    """``(ranks, why)`` for a job started without ``-np``: every slot of ``hosts`` when given, else one
    rank per GPU of this machine when it has ``gpus``, else one per CPU core; ``why`` says which, in words."""
    if hosts:
        n = total_slots(hosts)
        return n, f"{n} rank(s), one per slot of the {len(hosts)} host(s)"
    if gpus:
        return gpus, f"{gpus} rank(s) on this machine (one per GPU)"
    return cores, f"{cores} rank(s) on this machine (one per CPU core; no NVIDIA GPU visible)"


def build(
    spec: JobSpec,
    *,
    is_root: bool,
    cores: int,
    python: str | None = None,
    job_id: str | None = None,
    progress: bool | None = None,
    base_env: Mapping[str, str] | None = None,
    here: Callable[[str], bool] | None = None,
    mpirun: str | None = None,
) -> Plan:
    """The Plan that runs ``spec``.

    With ``job_id``, each rank runs ``python -m hvdkit.launcher.rankwrap -- COMMAND`` with
    HVDKIT_JOB_ID set: the wrapper reports its pid and how the rank ended on its own output, so the
    launcher can name the rank that failed first, on any host.
    ``is_root`` adds mpirun's ``--allow-run-as-root``. Without hosts the ranks run here
    (``localhost:N``) and ``num_proc > cores`` adds ``--oversubscribe``; with hosts they become
    ``-H a:2,b:2`` (names with a dot are kept whole: ``orte_keep_fqdn_hostnames``, as the MPI
    Operator sets it). A host is this machine when its name is ``localhost``/``127.0.0.1`` or
    ``here(name)`` says so (``hvdkit run`` passes ``remote.is_this_machine``: its host name, its
    addresses). When every host is, the ranks run the program that ``base_env``'s PATH finds (by
    full path) and mpirun gets ``--noprefix``; otherwise mpirun exports PATH, LD_LIBRARY_PATH and
    PYTHONPATH (those set in ``base_env``), every host's PATH finds the program, and ``keeps_prefix``
    decides ``--noprefix``, so the ranks' PATH is the launching shell's there too. ``mpirun``: the
    mpirun to start (default: ``find_tool("mpirun", python)``; a rendered script's is the bare name).
    ``progress`` (True/False/None) sets HVDKIT_PROGRESS for the ranks unless the user set it.
    ``spec.timeline`` sets HOROVOD_TIMELINE (and HOROVOD_TIMELINE_MARK_CYCLES) for every rank,
    over any value of the user's: only rank 0 writes the file.
    Every ``NCCL_*``, ``HOROVOD_*`` and ``HVDKIT_*`` variable of ``base_env`` reaches every rank
    (mpirun ``-x NAME``; horovodrun passes the launcher's environment on), and ``spec.network_interface`` also sets
    NCCL_SOCKET_IFNAME for the ranks, unless the user set it (in ``base_env`` or ``spec.env``).
    """
    python = python or sys.executable
    base_env = os.environ if base_env is None else base_env
    env = dict(spec.env)
    env.setdefault("PYTHONUNBUFFERED", "1")  # ranks' output is streamed through a pipe
    if job_id:
        env[_env.JOB_ID] = job_id
    if progress is not None and _env.PROGRESS not in base_env and _env.PROGRESS not in env:
        env[_env.PROGRESS] = "1" if progress else "0"
    if spec.timeline:
        env[TIMELINE] = spec.timeline
        if spec.timeline_mark_cycles:
            env[MARK_CYCLES] = "1"
    if spec.network_interface and NCCL_SOCKET_IFNAME not in base_env and NCCL_SOCKET_IFNAME not in env:
        env[NCCL_SOCKET_IFNAME] = spec.network_interface  # NCCL's own TCP bootstrap and sockets, as mpirun's btl/oob
    local = is_local(spec.hosts, here)
    # Here, the program the launching shell would run; across hosts each host's PATH (exported) finds it.
    command = resolve_program(spec.command, base_env.get("PATH", os.defpath)) if local else tuple(spec.command)
    wrapped = (python, "-m", "hvdkit.launcher.rankwrap", "--", *command) if job_id else command
    n = str(spec.num_proc)
    if spec.controller == "gloo":
        hosts = format_hosts(spec.hosts) if spec.hosts else f"localhost:{n}"
        nic = ("--network-interface", spec.network_interface) if spec.network_interface else ()
        argv = (find_tool("horovodrun", python), "-np", n, "-H", hosts, "--gloo", *nic, *wrapped)
        return Plan(argv=argv, env=env)
    mpirun = mpirun or find_tool("mpirun", python)
    argv = [mpirun, "-np", n]
    if spec.hosts:
        argv += ["-H", format_hosts(spec.hosts)]
    if is_root:
        argv.append("--allow-run-as-root")
    if not keeps_prefix(mpirun, local):
        argv.append("--noprefix")

    if not spec.hosts and spec.num_proc > cores:  # given hosts state their slots; no need
        argv.append("--oversubscribe")
    argv += ["--bind-to", "none", "--map-by", "slot", "--tag-output"]
    if any("." in host.name for host in spec.hosts):  # Open MPI would cut "w-0.svc" to "w-0" and ssh there
        argv += ["--mca", "orte_keep_fqdn_hostnames", "true"]
    if spec.network_interface:  # both the data path (btl) and mpirun's own control channel (oob)
        nic = spec.network_interface
        argv += ["--mca", "btl_tcp_if_include", nic, "--mca", "oob_tcp_if_include", nic]
    exported = set(env) | {
        name for name in base_env if name.startswith(FORWARDED_PREFIXES) and name not in NOT_FORWARDED
    }
    if not local:
        exported.update(name for name in FORWARDED if name in base_env)
    for name in sorted(exported):
        argv += ["-x", name]
    argv += [*spec.mpi_args, *wrapped]
    return Plan(argv=tuple(argv), env=env)
