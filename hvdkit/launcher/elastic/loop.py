"""Run an elastic job: fixed-size attempts, hosts re-discovered between and polled during them.

Each attempt is one plain mpirun / horovodrun --gloo job (``launch``); no Horovod elastic driver,
rendezvous or KV store is ever started. While an attempt runs, a thread polls the discovery every
``interval`` seconds: hosts that left end the attempt, and added slots (below ``--max-np``) ask
the ranks to stop at the same step through the preemption path (they checkpoint and exit 0), so
the next attempt starts bigger. After a failure the launcher re-discovers the hosts, drops those
ssh cannot reach, and relaunches on what is left if it holds ``--min-np`` slots; below that it
waits up to ``--elastic-timeout`` seconds, then gives up naming what is missing.
"""

from __future__ import annotations

import dataclasses
import signal
import threading
import time
from collections.abc import Callable, Mapping, Sequence

from ...core.errors import LaunchError
from .. import remote
from ..execute import Execution, JobResult, RankProgress
from ..hosts import Host, format_hosts, total_slots
from .discovery import DiscoveryError, FixedDiscovery, ScriptDiscovery
from .rules import (
    FAILED,
    FINISHED,
    GROW,
    INTERRUPTED,
    Attempt,
    ElasticSettings,
    History,
    below_min_message,
    can_grow,
    choose_world,
    lost_hosts,
)

__all__ = [
    "HostView",
    "ElasticGaveUp",
    "StopRequest",
    "Membership",
    "ElasticMembership",
    "FixedMembership",
    "wait_for_world",
    "watch",
    "run_elastic",
    "run_attempts",
]

LEFT = "stopped: hosts left"
BEHIND = "resumed behind its checkpoints"  # fatal: the checkpoint folder is not what the last attempt wrote
_STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)  # what a stop request sends the ranks
RECHECK, FRESH = 2.0, 5.0  # seconds: re-check joining hosts while ranks start; trust a check this old once they train
LIVENESS_EVERY = 10.0  # seconds between ssh checks of the running attempt's remote hosts
GROW_SETTLE = 60.0  # seconds after the ranks started before a job without a PreemptionGuard is asked to grow

Clock = Callable[[], float]  # time.monotonic
Sleep = Callable[[float], object]  # time.sleep
Log = Callable[[str], object]  # one line for the user
Check = Callable[[list[Host], float], Mapping[str, str]]  # (hosts, ssh timeout) -> {name: why unreachable}
Launch = Callable[[tuple[Host, ...], int, int], Execution]  # (hosts, attempt, changes) -> the attempt, ready to run


class StopRequest:
    """Asks a running job, from another thread, to stop as a SIGTERM to the launcher would: every
    rank gets the chance to checkpoint the same step (PreemptionGuard) and exit cleanly."""

    def __init__(self) -> None:
        self._event = threading.Event()
        self.reason = None
        self.hard = False

    def request(self, reason: str, hard: bool = False) -> None:
        """Ask once; ``hard``: a host is gone, so no rank can finish a step: end the job now."""
        if not self._event.is_set():
            self.reason, self.hard = reason, hard
            self._event.set()

    def is_set(self) -> bool:
        return self._event.is_set()

    def wait(self, timeout: float | None) -> bool:
        return self._event.wait(timeout)


class ElasticGaveUp(LaunchError):
    """Fewer than --min-np slots for longer than --elastic-timeout; ``history`` holds the attempts so far."""

    def __init__(self, message: str, history: History) -> None:
        super().__init__(message)
        self.history = history


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


def behind_message(resumed: int, saved: int) -> str:
    """Why an attempt that resumed at step ``resumed`` after step ``saved`` was checkpointed must stop."""
    return (
        f"the ranks resumed at step {resumed}, but an earlier attempt checkpointed step {saved}: rank 0 does not "
        "see the checkpoints it wrote (the checkpoint folder is on a disk of one host, and rank 0 moved to "
        "another), or the newest ones were lost. Stopped instead of training again from an older state: put "
        "the checkpoint folder on storage every host shares"
    )


def _behind(resumed: int | None, saved: int | None) -> bool:
    return resumed is not None and saved is not None and resumed < saved


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


def _ended(record: Attempt, result: JobResult, stop: StopRequest, clock: Clock, saved: int | None = None) -> str:
    """Fill ``record`` from the attempt's JobResult; its outcome."""
    record.running, record.ended = result.ranks_started_at, clock()
    record.resumed_step, record.last_step = result.resumed_step, result.last_step
    if result.interrupted_by is not None:
        record.outcome = INTERRUPTED
    elif _behind(result.resumed_step, saved):  # also when it ran to the end: from an older state
        record.outcome, record.detail = BEHIND, behind_message(result.resumed_step, saved)
    elif result.exit_code == 0 and (result.stop_reason is None or (result.guarded and not result.stopped_as_asked)):
        # a request that came after the ranks' last should_stop() (final evaluation, export) found
        # them finishing: they end 0 without having stopped for it, and must not run again
        record.outcome = FINISHED
    elif result.exit_code == 0 or (result.stop_reason and result.signal in _STOP_SIGNALS and not stop.hard):
        # stopped as asked; a rank our own stop signal ended (one not yet or no longer training
        # under a PreemptionGuard) is no failure either: the next attempt resumes from a checkpoint
        record.outcome = GROW if result.stop_reason.endswith("came") else LEFT
        record.detail = result.stop_reason + ("" if result.exit_code == 0 else f"; {result.message}")
    else:
        record.outcome, record.detail = FAILED, (f"{result.stop_reason}; " if stop.hard else "") + result.message
        record.noticed = record.noticed or result.failure_noticed_at or clock()
    if record.noticed is None:
        record.noticed = clock()
    return record.outcome


class Membership:
    """Which hosts each attempt of a job gets (``first``, then ``next`` after each attempt), how many
    ranks a world runs (``size``), and what watches a running attempt (``watch``: a thread, or None
    when nothing is polled, as for a fixed-size job)."""

    elastic = False

    def watch(
        self,
        world: Sequence[Host],
        stop: StopRequest,
        ended: threading.Event,
        record: Attempt,
        progress: Callable[[], RankProgress],
        saved: int | None,
    ) -> threading.Thread | None:
        return None


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
        return total_slots(world)

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


class FixedMembership(Membership):
    """The same hosts and number of ranks for every attempt, nothing polled: a fixed-size job
    (``hosts`` ``()`` is this machine)."""

    elastic = False

    def __init__(self, hosts: Sequence[Host], num_proc: int) -> None:
        self.hosts, self.num_proc = tuple(hosts), num_proc

    def first(self) -> tuple[Host, ...]:
        return self.hosts

    def next(self, previous: tuple[Host, ...], record: Attempt, failed: bool) -> tuple[Host, ...]:
        return self.hosts

    def size(self, world: Sequence[Host]) -> int:
        return self.num_proc


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


def run_attempts(
    membership: Membership,
    launch: Launch,
    max_restarts: int,
    clock: Clock = time.monotonic,
    log: Log = print,
) -> tuple[History, JobResult]:
    """Run attempts until one finishes; ``(history, final JobResult)``. The one restart loop of
    every ``hvdkit run``: fixed-size jobs (FixedMembership) and elastic ones (ElasticMembership).

    ``launch(hosts, attempt, changes)`` returns the attempt (``changes``: the membership changes so
    far) ready to run: an ``execute.Execution``, whose ``run(stop)`` returns its JobResult and whose
    ``progress()`` the watcher reads. Failures beyond ``max_restarts`` end the job; a stop to grow
    is not a failure, nor is a signal to the launcher (it ends the job). An attempt whose ranks
    resumed below the newest step an earlier one checkpointed ends the job (exit code 1 at least):
    they would train again from an older state. Raises ElasticGaveUp when fewer than ``min_np``
    slots stay available for ``timeout`` seconds.
    """
    history = History()
    try:
        world = membership.first()
    except LaunchError as e:
        raise ElasticGaveUp(str(e), history) from None
    failures = changes = 0
    saved = None  # the newest step any attempt checkpointed
    while True:
        size = membership.size(world)
        if history.attempts and world != history.attempts[-1].hosts:
            changes += 1
            log(f"membership change {changes}: {history.attempts[-1].size} -> {size} rank(s) on {format_hosts(world)}")
        record = Attempt(hosts=world, launched=clock(), ranks=size)
        history.attempts.append(record)
        job = launch(world, len(history.attempts) - 1, changes)
        stop, ended = StopRequest(), threading.Event()
        watcher = membership.watch(world, stop, ended, record, job.progress, saved)
        try:
            result = job.run(stop)
        finally:
            ended.set()
            if watcher is not None:
                watcher.join()
        outcome = _ended(record, result, stop, clock, saved)
        if outcome == BEHIND:
            log(record.detail)
            return history, dataclasses.replace(result, exit_code=result.exit_code or 1, message=record.detail)
        if outcome in (FINISHED, INTERRUPTED):
            return history, result
        if result.saved_step is not None:
            saved = max(saved or 0, result.saved_step)
        if outcome == FAILED:
            failures += 1
            if failures > max_restarts:
                if membership.elastic:
                    log(
                        f"{result.message}; {failures - 1} restart(s) after failures used of --max-restarts "
                        f"{max_restarts}"
                    )
                return history, result
            if membership.elastic:
                log(f"{result.message}; re-discovering the hosts ({failures}/{max_restarts} restarts after failures)")
            else:
                log(f"{result.message}; restarting ({failures}/{max_restarts})")
        try:
            world = membership.next(world, record, outcome == FAILED)
        except LaunchError as e:
            raise ElasticGaveUp(str(e), history) from None
