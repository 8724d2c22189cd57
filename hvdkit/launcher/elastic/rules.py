"""Elastic training by restart: the pure rules (which world to launch, when to grow, what to report).

An elastic job is a sequence of ordinary fixed-size attempts (plain mpirun or horovodrun --gloo;
Horovod's elastic driver and its rendezvous store are never started). Between attempts the
launcher re-discovers the hosts and relaunches on what is there, between ``--min-np`` and
``--max-np`` ranks; the ranks resume from their newest checkpoint. ``hvdkit.launcher.elastic.loop``
runs the loop; everything here is pure and takes the clock's readings as numbers.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ...core.errors import ConfigError
from ..hosts import Host, format_hosts, total_slots

if TYPE_CHECKING:
    from ..execute import JobResult

__all__ = [
    "ElasticSettings",
    "settings_from",
    "choose_world",
    "lost_hosts",
    "can_grow",
    "Attempt",
    "History",
    "below_min_message",
    "DEFAULT_DISCOVERY_INTERVAL",
    "DEFAULT_ELASTIC_TIMEOUT",
    "DEFAULT_ELASTIC_MAX_RESTARTS",
]

DEFAULT_DISCOVERY_INTERVAL = 5.0  # seconds between polls of the host discovery
DEFAULT_ELASTIC_TIMEOUT = 600.0  # seconds to wait for --min-np slots before giving up (horovodrun's default)
DEFAULT_ELASTIC_MAX_RESTARTS = 10  # failures an elastic job survives unless --max-restarts says otherwise

# How an attempt ended.
FINISHED, FAILED, GROW, INTERRUPTED = "finished", "failed", "stopped to grow", "interrupted"


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


@dataclass
class Attempt:
    """One launch of a job (fixed-size or elastic), with the launcher's clock readings (seconds)."""

    hosts: tuple
    launched: float  # when the launcher started it
    running: float | None = None  # when every rank had reported its start
    noticed: float | None = None  # when the launcher saw it must end (a failure, hosts to grow into)
    outcome: str = ""  # FINISHED, FAILED, GROW or INTERRUPTED
    detail: str = ""  # the failure message, or the hosts that came
    ended: float | None = None  # when its launcher (mpirun/horovodrun) had exited
    resumed_step: int | None = None  # the step the ranks resumed at, when they report steps
    last_step: int | None = None  # the last step they reported
    ranks: int | None = None  # its number of ranks, when not every slot of ``hosts`` (a fixed-size job)

    @property
    def size(self) -> int:
        return total_slots(self.hosts) if self.ranks is None else self.ranks


@dataclass
class History:
    """Every attempt of a job; ``summary(final, elastic)`` is what ``hvdkit run`` prints at the end."""

    attempts: list = field(default_factory=list)

    def changes(self) -> list[dict[str, Any]]:
        """One dict per relaunch: sizes, why, seconds from noticing to the new ranks running, steps recomputed."""
        out = []
        for before, after in zip(self.attempts, self.attempts[1:], strict=False):
            lost = None
            if before.noticed is not None and after.running is not None:
                lost = round(after.running - before.noticed, 2)
            redo = None
            if before.last_step is not None and after.resumed_step is not None:
                redo = max(0, before.last_step - after.resumed_step)
            stopping = None
            if before.noticed is not None and before.ended is not None:
                stopping = round(max(0.0, before.ended - before.noticed), 2)
            out.append(
                {
                    "from": before.size,
                    "to": after.size,
                    "why": before.outcome,
                    "seconds": lost,
                    "stopping_seconds": stopping,
                    "steps_recomputed": redo,
                }
            )
        return out

    def summary(self, final: JobResult | None = None, elastic: bool = True) -> list[str]:
        """The closing lines. Elastic: attempts, world size over time, and per change the time lost
        and steps recomputed. Fixed-size: one line, only when something failed: what failed, how,
        and how many restarts were used. With ``final`` (the last JobResult) an elastic summary also
        ends with its failure, if it failed."""
        if not elastic:
            line = self._restarts_line(final)
            return [line] if line else []
        lines = self._elastic_lines()
        if final is not None and final.exit_code != 0:
            lines.append(final.message)
        return lines

    def _restarts_line(self, final: JobResult | None) -> str:
        if final is None or (final.interrupted_by is not None and final.exit_code == 0):
            return ""
        failed = [(i, a) for i, a in enumerate(self.attempts, start=1) if a.outcome == FAILED]
        restarts = len(self.attempts) - 1
        used = f"{restarts} restart{'s' if restarts != 1 else ''} used"
        if final.exit_code == 0:
            return (
                f"job finished after {used} ({'; '.join(f'attempt {i}: {a.detail}' for i, a in failed)})"
                if failed
                else ""
            )
        line = f"{final.message} (exit code {final.exit_code}{f'; {used}' if restarts else ''})"
        if len(failed) > 1:
            line += f"; earlier: {'; '.join(f'attempt {i}: {a.detail}' for i, a in failed[:-1])}"
        return line

    def _elastic_lines(self) -> list[str]:
        sizes = " -> ".join(str(a.size) for a in self.attempts)
        lines = [f"elastic summary: {len(self.attempts)} attempt(s), world size {sizes}"]
        for i, a in enumerate(self.attempts, start=1):
            took = f", {a.noticed - a.launched:.1f} s" if a.noticed is not None else ""
            lines.append(
                f"  attempt {i}: {a.size} rank(s) on {format_hosts(a.hosts)}{took}: {a.outcome}"
                + (f" ({a.detail})" if a.detail else "")
            )
        for c in self.changes():
            secs = "unknown" if c["seconds"] is None else f"{c['seconds']:.2f} s"
            redo = (
                "unknown (the ranks reported no steps)" if c["steps_recomputed"] is None else str(c["steps_recomputed"])
            )
            kind = "shrink" if c["to"] < c["from"] else "grow" if c["to"] > c["from"] else "relaunch"
            stop = (
                ""
                if c["stopping_seconds"] is None
                else f" ({c['stopping_seconds']:.2f} s of it for the old ranks to end)"
            )
            lines.append(
                f"  {kind} {c['from']} -> {c['to']} ({c['why']}): {secs} from noticing to the new ranks running{stop}, "
                f"steps recomputed: {redo}"
            )
        return lines
