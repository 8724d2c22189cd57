"""Elastic training by restart: the pure rules (which world to launch, when to grow, why it gave up).

An elastic job is a sequence of ordinary fixed-size attempts (plain mpirun or horovodrun --gloo;
Horovod's elastic driver and its rendezvous store are never started). Between attempts the
launcher re-discovers the hosts and relaunches on what is there, between ``--min-np`` and
``--max-np`` ranks; the ranks resume from their newest checkpoint. ``hvdkit.launcher.elastic.loop``
runs the loop; everything here is pure and takes the clock's readings as numbers. The record of every
job's attempts and its closing summary (``Attempt``, ``History``) are in ``hvdkit.launcher.attempts``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from ...core.errors import ConfigError
from ..attempts import Attempt, History  # noqa: F401 - the old path hvdkit.launch.elastic offered them (until 0.3)
from ..hosts import Host, format_hosts, total_slots

__all__ = [
    "ElasticSettings",
    "settings_from",
    "choose_world",
    "lost_hosts",
    "can_grow",
    "below_min_message",
    "DEFAULT_DISCOVERY_INTERVAL",
    "DEFAULT_ELASTIC_TIMEOUT",
    "DEFAULT_ELASTIC_MAX_RESTARTS",
]

DEFAULT_DISCOVERY_INTERVAL = 5.0  # seconds between polls of the host discovery
DEFAULT_ELASTIC_TIMEOUT = 600.0  # seconds to wait for --min-np slots before giving up (horovodrun's default)
RECOVERY_WAYS = ("restart", "in-process")  # hvdkit run --recovery: relaunch from checkpoints, or Horovod's driver
DEFAULT_ELASTIC_MAX_RESTARTS = 10  # failures an elastic job survives unless --max-restarts says otherwise


@dataclass(frozen=True)
class ElasticSettings:
    """World sizes an elastic job may run at: it starts with ``num_proc`` ranks (fewer if only
    ``min_np`` slots are there) and later grows up to ``max_np``."""

    num_proc: int
    min_np: int
    max_np: int
    interval: float = DEFAULT_DISCOVERY_INTERVAL
    timeout: float = DEFAULT_ELASTIC_TIMEOUT
    discovery: str = ""  # where the hosts come from, for messages

    def describe(self) -> str:
        return (
            f"elastic: start with {self.num_proc} rank(s), run with {self.min_np}..{self.max_np}; "
            f"hosts from {self.discovery}, polled every {self.interval:g} s; "
            f"below {self.min_np} slot(s) wait up to {self.timeout:g} s"
        )


def settings_from(
    num_proc: int,
    min_np: int | None,
    max_np: int | None,
    *,
    script: str | None,
    hosts: Sequence[Host],
    origin: str,
    interval: float,
    timeout: float,
) -> ElasticSettings | None:
    """The ElasticSettings of ``hvdkit run``'s flags, or None when the job is not elastic.

    ``script`` is the discovery script (or None), ``hosts`` the known hosts (``()`` = this machine)
    from ``origin``. Raises ConfigError for combinations that cannot work, before anything starts.
    """
    if min_np is None and max_np is None and script is None:
        return None
    min_np = num_proc if min_np is None else min_np
    max_np = num_proc if max_np is None else max_np
    if min_np < 1:
        raise ConfigError(f"--min-np must be >= 1 (got {min_np}): the fewest ranks the job may run with")
    if min_np > num_proc:
        raise ConfigError(
            f"--min-np {min_np} is more than -np {num_proc}; lower --min-np or raise -np (min <= np <= max)"
        )
    if num_proc > max_np:
        raise ConfigError(
            f"-np {num_proc} is more than --max-np {max_np}; raise --max-np or lower -np (min <= np <= max)"
        )
    if script is None:
        if not hosts:
            raise ConfigError(
                "--min-np/--max-np need hosts that can come and go: give --host-discovery-script SCRIPT, or "
                "-H/--hostfile with several hosts (on one machine, --max-restarts relaunches at the same size)"
            )
        known = total_slots(hosts)
        if max_np > known:
            raise ConfigError(
                f"--max-np {max_np} needs {max_np} slots but {origin} gives {known} ({format_hosts(hosts)}) "
                "and without "
                f"--host-discovery-script no host can join; lower --max-np to {known} or give a discovery script"
            )
    return ElasticSettings(
        num_proc, min_np, max_np, interval, timeout, script and f"--host-discovery-script {script}" or origin
    )


def choose_world(
    available: Sequence[Host], settings: ElasticSettings, previous: Iterable[Host] = (), first: bool = False
) -> tuple[Host, ...] | None:
    """The hosts (slots trimmed) of the next attempt, or None when fewer than ``min_np`` slots are there.

    The first attempt takes up to ``num_proc`` ranks, later ones up to ``max_np``. Hosts of the
    previous attempt come first, in their order, so rank 0 stays where it was when it can.
    """
    want = min(settings.num_proc if first else settings.max_np, total_slots(available))
    if want < settings.min_np:
        return None
    names = [h.name for h in previous]
    ordered = sorted(available, key=lambda h: names.index(h.name) if h.name in names else len(names))
    chosen, left = [], want
    for host in ordered:
        if left == 0:
            break
        take = min(host.slots, left)
        chosen.append(Host(host.name, take))
        left -= take
    return tuple(chosen)


def lost_hosts(running: Iterable[Host], discovered: Iterable[Host]) -> list[str]:
    """Names of the hosts of the running attempt that discovery no longer lists with their slots."""
    slots = {h.name: h.slots for h in discovered}
    return [h.name for h in running if slots.get(h.name, 0) < h.slots]


def can_grow(running: Iterable[Host], available: Iterable[Host], settings: ElasticSettings) -> bool:
    """True when the available hosts hold more slots than the running attempt uses, below ``max_np``."""
    size = total_slots(running)
    return size < settings.max_np and min(total_slots(available), settings.max_np) > size


def below_min_message(
    settings: ElasticSettings,
    available: Sequence[Host],
    previous: Iterable[Host],
    unreachable: Mapping[str, str],
    waited: float,
) -> str:
    """The error when fewer than ``min_np`` slots stayed available for ``waited`` seconds."""
    have = total_slots(available)
    names = {h.name for h in available}
    missing = [h for h in previous if h.name not in names]
    why = "; ".join(f"{h}: {unreachable.get(h.name, 'no longer listed by discovery')}" for h in missing)
    return (
        f"only {have} slot(s) available ({format_hosts(available) or 'none'}), fewer than --min-np {settings.min_np}, "
        f"for {waited:.0f} s (--elastic-timeout {settings.timeout:g})"
        + (f"; missing: {why}" if missing else "")
        + (f"; host discovery failed: {unreachable['discovery']}" if unreachable.get("discovery") else "")
        + f"; hosts from {settings.discovery}. "
        "The newest checkpoint is kept: bring the hosts back and run the job again"
    )
