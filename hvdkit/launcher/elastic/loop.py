"""Run an elastic job: fixed-size attempts (``attempts.run_attempts``), hosts re-discovered between
and polled during them (``ElasticMembership``).

Each attempt is one plain mpirun / horovodrun --gloo job (``launch``); no Horovod elastic driver,
rendezvous or KV store is ever started. While an attempt runs, a thread polls the discovery every
``interval`` seconds: hosts that left end the attempt, and added slots (below ``--max-np``) ask
the ranks to stop at the same step through the preemption path (they checkpoint and exit 0), so
the next attempt starts bigger. After a failure the launcher re-discovers the hosts, drops those
ssh cannot reach, and relaunches on what is left if it holds ``--min-np`` slots; below that it
waits up to ``--elastic-timeout`` seconds, then gives up naming what is missing.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence

from ...core.errors import LaunchError
from .. import remote
from ..attempts import (
    Attempt,
    Clock,
    History,
    Launch,
    Log,
    Membership,
    StopRequest,
    _behind,
    behind_message,
    run_attempts,
    world_size,
)
from ..execute import JobResult, RankProgress
from ..hosts import Host, format_hosts
from .discovery import DiscoveryError, FixedDiscovery, ScriptDiscovery
from .rules import ElasticSettings, below_min_message, can_grow, choose_world, lost_hosts

__all__ = ["HostView", "ElasticMembership", "wait_for_world", "watch", "run_elastic"]

RECHECK, FRESH = 2.0, 5.0  # seconds: re-check joining hosts while ranks start; trust a check this old once they train
LIVENESS_EVERY = 10.0  # seconds between ssh checks of the running attempt's remote hosts
GROW_SETTLE = 60.0  # seconds after the ranks started before a job without a PreemptionGuard is asked to grow

Sleep = Callable[[float], object]  # time.sleep
Check = Callable[[list[Host], float], Mapping[str, str]]  # (hosts, ssh timeout) -> {name: why unreachable}


class HostView:
    """The hosts there now: what ``source`` lists (a discovery script or fixed hosts), less those
    ssh cannot reach. ``check(hosts, timeout)`` returns ``{name: why}`` of the unreachable."""

    def __init__(
        self, source: ScriptDiscovery | FixedDiscovery, check: Check = remote.unreachable, ssh_timeout: float = 15.0
    ) -> None:
        self.source, self.check, self.ssh_timeout = source, check, ssh_timeout

    def listed(self) -> tuple[tuple[Host, ...] | None, str | None]:
        """What the source lists now, or None (and the reason) when it fails."""
        try:
            return self.source.hosts(), None
        except DiscoveryError as e:
            return None, str(e)

    def now(self) -> tuple[tuple[Host, ...], Mapping[str, str]]:
        """``(available, {name: why unavailable})``: what is listed, less what ssh cannot reach."""
        listed, error = self.listed()
        if listed is None:
            return (), {"discovery": error}
        bad = self.check(list(listed), self.ssh_timeout)
        return tuple(h for h in listed if h.name not in bad), bad


def wait_for_world(
    view: HostView,
    settings: ElasticSettings,
    previous: Sequence[Host] = (),
    first: bool = False,
    clock: Clock = time.monotonic,
    sleep: Sleep = time.sleep,
    log: Log = print,
) -> tuple[tuple[Host, ...], Mapping[str, str]]:
    """The hosts of the next attempt; waits (polling every ``interval``) while fewer than
    ``min_np`` slots are there, and raises LaunchError naming what is missing after ``timeout``."""
    t0 = clock()
    said = failing = None
    while True:
        available, bad = view.now()
        failing = _say_discovery(bad.get("discovery"), failing, log)
        world = choose_world(available, settings, previous, first)
        if world:
            return world, bad
        waited = clock() - t0
        if waited >= settings.timeout:
            raise LaunchError(below_min_message(settings, available, previous, bad, waited))
        if said != available:
            log(
                f"only {format_hosts(available) or 'no slots'} available, fewer than --min-np {settings.min_np}: "
                f"waiting up to {settings.timeout - waited:.0f} s for hosts"
            )
            said = available
        sleep(min(settings.interval, max(0.0, settings.timeout - waited)))


def watch(
    view: HostView,
    running: Sequence[Host],
    settings: ElasticSettings,
    stop: StopRequest,
    ended: threading.Event,
    record: Attempt,
    clock: Clock = time.monotonic,
    log: Log = print,
    saved: int | None = None,
    progress: Callable[[], RankProgress] = RankProgress,
) -> None:
    """Poll discovery until ``ended`` is set; ask ``stop`` to end the attempt when a host of
    ``running`` is no longer listed, or when slots were added, the job may grow and its ranks are
    training (see ``_training``); end it at once when its ranks resumed below ``saved``, the newest
    step an earlier attempt checkpointed. ``progress()`` is the running attempt's RankProgress."""
    said = {}  # the hosts last said to be unreachable, and why
    failing = None  # the discovery error last said, while discovery fails
    checked = ()  # (when, names) of the joining hosts the last ssh check found reachable
    alive = _Liveness(view, running, clock, progress=lambda: progress().last_step, log=log)
    while not ended.wait(settings.interval):
        resumed = progress().resumed_step
        if _behind(resumed, saved):  # run_attempts says why once the attempt has ended
            record.noticed = clock()
            stop.request(behind_message(resumed, saved), hard=True)
            return
        dead = alive.check()
        if dead:
            record.noticed = clock()
            stop.request(f"{', '.join(dead)} stopped answering over ssh", hard=True)
            log(
                f"membership change: {', '.join(f'{n} ({why})' for n, why in dead.items())} stopped answering; "
                "ending the attempt"
            )
            return
        listed, error = view.listed()
        failing = _say_discovery(error, failing, log, running=True)
        if listed is None:  # a failing discovery says nothing about the hosts: keep running
            continue
        gone = lost_hosts(running, listed)
        if gone:
            record.noticed = clock()
            stop.request(f"{', '.join(gone)} no longer listed by discovery")
            log(f"membership change: {', '.join(gone)} left; stopping the ranks to relaunch without them")
            return
        used = {h.name for h in running}
        extra = [
            h for h in listed if h.name not in used or h.slots > next(r.slots for r in running if r.name == h.name)
        ]
        if not extra:
            continue
        joining = [h for h in extra if h.name not in used]
        training = _training(progress(), clock)
        if (
            checked
            and clock() - checked[0] < (FRESH if training else RECHECK)
            and {h.name for h in joining} <= checked[1]
        ):
            bad = {}  # checked a moment ago, while the ranks were still starting: ask them at once
        else:
            bad = view.check(joining, view.ssh_timeout)
            checked = (clock(), {h.name for h in joining if h.name not in bad})
        if bad and set(bad) != set(said):
            log("; ".join(f"{name} is listed but cannot join yet: {why}" for name, why in bad.items()))
        said = bad
        available = tuple(h for h in listed if h.name not in bad)
        if can_grow(running, available, settings) and training:
            record.noticed = clock()
            came = ", ".join(str(h) for h in extra if h.name not in bad)
            stop.request(f"{came} came")
            log(f"membership change: {came} can join; asking the ranks to stop at the same step and relaunching bigger")
            return


def _say_discovery(error: str | None, said: str | None, log: Log, running: bool = False) -> str | None:
    """Log a discovery error when it starts or changes, and that discovery works again; the error now."""
    if error and error != said:
        log(f"host discovery failed: {error}" + ("; the ranks keep running on their hosts" if running else ""))
    elif said and not error:
        log("host discovery works again")
    return error


class _Liveness:
    """ssh checks of the running attempt's hosts every LIVENESS_EVERY seconds. A host that vanished
    without closing its connections (power loss, a cut link) stalls every rank inside a collective
    and mpirun itself, and no stall timeout fires; ``check()`` gives ``{name: why}`` for the hosts
    that failed two checks in a row while the job was silent: a step reported since the first of
    them (``progress()``, rank 0's newest step) means every rank took part in collectives, so the
    host lives and ssh alone failed (a DNS hiccup, sshd throttling); that is logged, not acted on."""

    def __init__(
        self,
        view: HostView,
        running: Sequence[Host],
        clock: Clock,
        progress: Callable[[], int | None] = lambda: None,
        log: Log = print,
    ) -> None:
        self.view, self.running, self.clock, self.progress, self.log = view, running, clock, progress, log
        self.last, self.failed, self.step = clock(), {}, None
        self.excused = set()  # hosts said to fail ssh while the ranks train (said once, until they pass a check)

    def check(self) -> dict[str, str]:
        if self.clock() - self.last < LIVENESS_EVERY:
            return {}
        self.last = self.clock()
        bad = self.view.check(list(self.running), self.view.ssh_timeout)
        dead = {name: why for name, why in bad.items() if name in self.failed}
        step = self.progress()
        if dead and step is not None and step != self.step:
            new = {n: why for n, why in dead.items() if n not in self.excused}
            if new:
                self.log(
                    f"{', '.join(f'{n} ({why})' for n, why in new.items())} failed two ssh checks, but the ranks "
                    f"keep training (step {step}): not ending the attempt"
                )
            self.excused |= set(dead)
            dead = {}
        self.excused &= set(bad)
        self.failed, self.step = bad, step
        return dead


def _training(progress: RankProgress, clock: Clock) -> bool:
    """True once the ranks can take a stop request: their PreemptionGuard reported (its first
    ``should_stop``), or, for scripts without one, GROW_SETTLE seconds after they started. A stop
    asked earlier would kill ranks still loading, before they can checkpoint."""
    started = progress.started_at
    return progress.training or (started is not None and clock() - started >= GROW_SETTLE)


class ElasticMembership(Membership):
    """Which hosts each attempt of an elastic job gets: re-discovered between attempts (waiting for
    ``min_np`` slots), and watched while one runs (``watch``)."""

    elastic = True

    def __init__(
        self,
        settings: ElasticSettings,
        view: HostView,
        clock: Clock = time.monotonic,
        sleep: Sleep = time.sleep,
        log: Log = print,
    ) -> None:
        self.settings, self.view, self.clock, self.sleep, self.log = settings, view, clock, sleep, log

    def first(self) -> tuple[Host, ...]:
        return self._wait(first=True)

    def next(self, previous: tuple[Host, ...], record: Attempt, failed: bool) -> tuple[Host, ...]:
        world = self._wait(previous=previous)
        gone = [h.name for h in record.hosts if h.name in self._bad]
        if failed and gone:  # what the launcher's own message could not say
            record.detail += f"; then {', '.join(gone)} could not be reached"
        return world

    def _wait(self, previous: Sequence[Host] = (), first: bool = False) -> tuple[Host, ...]:
        world, self._bad = wait_for_world(self.view, self.settings, previous, first, self.clock, self.sleep, self.log)
        for name, why in self._bad.items():  # attempt 1 too: a job that starts on fewer hosts says which and why
            self.log(f"host {name} left out: {why}")
        return world

    def size(self, world: Sequence[Host]) -> int:
        return world_size(world)

    def watch(
        self,
        world: Sequence[Host],
        stop: StopRequest,
        ended: threading.Event,
        record: Attempt,
        progress: Callable[[], RankProgress],
        saved: int | None,
    ) -> threading.Thread:
        args = (self.view, world, self.settings, stop, ended, record, self.clock, self.log, saved, progress)
        thread = threading.Thread(target=watch, args=args, daemon=True)
        thread.start()
        return thread


def run_elastic(
    settings: ElasticSettings,
    view: HostView,
    launch: Launch,
    max_restarts: int,
    clock: Clock = time.monotonic,
    sleep: Sleep = time.sleep,
    log: Log = print,
) -> tuple[History, JobResult]:
    """``run_attempts`` with the hosts of ``view`` re-discovered and watched (ElasticMembership)."""
    return run_attempts(ElasticMembership(settings, view, clock, sleep, log), launch, max_restarts, clock, log)
