"""Horovod's own elastic mode as an hvdkit job (``hvdkit run --horovod-elastic``): the ``horovodrun``
command line for scripts written with ``hvd.elastic.run``. Apart from ``plan``, which it builds on,
so that the plan of a fixed job does not depend on the elastic rules."""

from __future__ import annotations

import sys

from ...core import env as _env
from ..hosts import format_hosts
from ..plan import Plan, find_tool
from ..spec import JobSpec
from .rules import ElasticSettings

__all__ = ["build_horovod_elastic"]


def build_horovod_elastic(
    spec: JobSpec,
    settings: ElasticSettings,
    discovery_script: str | None,
    *,
    python: str | None = None,
    stall_timeout: float | None = None,
    slots_per_host: int | None = None,
    blacklist_cooldown: tuple[int, int] | None = None,
) -> Plan:
    """The Plan that runs ``spec`` under Horovod's own elastic driver (``hvdkit run --horovod-elastic``):
    one ``horovodrun -np N --min-np MIN --max-np MAX --gloo`` job whose workers come and go inside it,
    for scripts written with ``hvd.elastic.run`` (state restored from the last ``commit()`` in the
    surviving processes). Hosts come from ``discovery_script``, else ``spec.hosts`` (default:
    ``localhost:N``); Horovod's elastic mode is Gloo only. No rank wrappers: a worker that dies is
    an event the driver handles, not the end of the job.
    ``spec.timeline`` becomes horovodrun's ``--timeline-filename`` (and ``--timeline-mark-cycles``);
    ``stall_timeout`` (``--stall-timeout``) its ``--stall-check-shutdown-time-seconds``, with the
    warning time hvdkit's own ranks derive (``env.stall_settings``); ``slots_per_host``, the slots of
    a host the discovery script lists without ``:slots``, its ``--slots-per-host``; ``blacklist_cooldown``
    ``(min, max)`` seconds, its ``--blacklist-cooldown-range`` (a host left out comes back after a cooldown
    that doubles with each time; without it, never).
    """
    python = python or sys.executable
    env = dict(spec.env)
    env.setdefault("PYTHONUNBUFFERED", "1")
    if discovery_script:
        where = ("--host-discovery-script", discovery_script)
    else:
        where = ("-H", format_hosts(spec.hosts) if spec.hosts else f"localhost:{spec.num_proc}")
    if discovery_script and slots_per_host is not None:
        where += ("--slots-per-host", str(slots_per_host))
    nic = ("--network-interface", spec.network_interface) if spec.network_interface else ()
    argv = (
        find_tool("horovodrun", python),
        *("-np", str(spec.num_proc), "--min-np", str(settings.min_np), "--max-np", str(settings.max_np)),
        *where,
        *("--elastic-timeout", str(max(1, round(settings.timeout)))),  # horovodrun takes whole seconds
        *nic,
        *_timeline_flags(spec),
        *_stall_flags(stall_timeout),
        *(("--blacklist-cooldown-range", *map(str, blacklist_cooldown)) if blacklist_cooldown else ()),
        "--gloo",
        *spec.command,
    )
    return Plan(argv=argv, env=env)


def _timeline_flags(spec: JobSpec) -> tuple[str, ...]:
    if not spec.timeline:
        return ()
    return ("--timeline-filename", spec.timeline, *(("--timeline-mark-cycles",) if spec.timeline_mark_cycles else ()))


def _stall_flags(stall_timeout: float | None) -> tuple[str, ...]:
    """horovodrun's stall flags for ``stall_timeout`` seconds: the whole seconds and warning time
    hvdkit's own ranks set from HVDKIT_STALL_TIMEOUT (Horovod reads whole seconds only)."""
    if stall_timeout is None:
        return ()
    chosen = _env.stall_settings({_env.STALL_TIMEOUT: f"{stall_timeout:g}"})
    return (
        *("--stall-check-warning-time-seconds", chosen[_env.HOROVOD_STALL_CHECK]),
        *("--stall-check-shutdown-time-seconds", chosen[_env.HOROVOD_STALL_SHUTDOWN]),
    )
