"""Horovod's own elastic mode as an hvdkit job (``hvdkit run --horovod-elastic``): the ``horovodrun``
command line for scripts written with ``hvd.elastic.run``. Apart from ``plan``, which it builds on,
so that the plan of a fixed job does not depend on the elastic rules."""

from __future__ import annotations

import sys

from ..hosts import format_hosts
from ..plan import Plan, find_tool
from ..spec import JobSpec
from .rules import ElasticSettings

__all__ = ["build_horovod_elastic"]


def build_horovod_elastic(
    spec: JobSpec, settings: ElasticSettings, discovery_script: str | None, *, python: str | None = None
) -> Plan:
    """The Plan that runs ``spec`` under Horovod's own elastic driver (``hvdkit run --horovod-elastic``):
    one ``horovodrun -np N --min-np MIN --max-np MAX --gloo`` job whose workers come and go inside it,
    for scripts written with ``hvd.elastic.run`` (state restored from the last ``commit()`` in the
    surviving processes). Hosts come from ``discovery_script``, else ``spec.hosts`` (default:
    ``localhost:N``); Horovod's elastic mode is Gloo only. No rank wrappers: a worker that dies is
    an event the driver handles, not the end of the job.
    """
    python = python or sys.executable
    env = dict(spec.env)
    env.setdefault("PYTHONUNBUFFERED", "1")
    if discovery_script:
        where = ("--host-discovery-script", discovery_script)
    else:
        where = ("-H", format_hosts(spec.hosts) if spec.hosts else f"localhost:{spec.num_proc}")
    nic = ("--network-interface", spec.network_interface) if spec.network_interface else ()
    argv = (
        find_tool("horovodrun", python),
        *("-np", str(spec.num_proc), "--min-np", str(settings.min_np), "--max-np", str(settings.max_np)),
        *where,
        *("--elastic-timeout", str(max(1, round(settings.timeout)))),  # horovodrun takes whole seconds
        *nic,
        "--gloo",
        *spec.command,
    )
    return Plan(argv=argv, env=env)
