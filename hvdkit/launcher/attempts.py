"""The one restart loop of every job: attempts until one finishes (``run_attempts``).

A job is a sequence of attempts, each one plain mpirun / horovodrun --gloo run (``Launch`` returns
it as an ``execute.Execution``). A ``Membership`` says which hosts each attempt gets and what
watches it: ``FixedMembership`` (a fixed-size job: the same hosts and size, nothing polled) here,
``elastic.loop.ElasticMembership`` (hosts re-discovered between attempts, watched during one) for
elastic jobs. Failures beyond ``max_restarts`` end the job; a stop asked for by the watcher (hosts
left or came) is not a failure; a signal to the launcher ends the job. How each attempt ended is
recorded in an ``Attempt`` of the job's ``History`` (``History.summary`` is the closing summary).
"""

from __future__ import annotations

import dataclasses
import signal
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..core.errors import LaunchError
from .execute import Execution, JobResult, RankProgress
from .hosts import Host, format_hosts, total_slots

__all__ = [
    "Attempt",
    "History",
    "StopRequest",
    "ElasticGaveUp",
    "Membership",
    "FixedMembership",
    "world_size",
    "run_attempts",
    "behind_message",
]

# How an attempt ended.
FINISHED, FAILED, GROW, INTERRUPTED = "finished", "failed", "stopped to grow", "interrupted"
LEFT = "stopped: hosts left"
BEHIND = "resumed behind its checkpoints"  # fatal: the checkpoint folder is not what the last attempt wrote


_STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)  # what a stop request sends the ranks


Clock = Callable[[], float]  # time.monotonic


Log = Callable[[str], object]  # one line for the user


# (hosts, ranks, attempt, changes) -> the attempt, ready to run
Launch = Callable[[tuple[Host, ...], int, int, int], Execution]


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
        """Its number of ranks (``world_size``)."""
        return world_size(self.hosts, self.ranks)


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


def world_size(world: Sequence[Host], fixed: int | None = None) -> int:
    """How many ranks an attempt on the hosts ``world`` runs: ``fixed``, the -np of a fixed-size job
    (its hosts may hold more slots; ``()`` is this machine), or, for an elastic job (``fixed`` None),
    every slot of ``world`` (``elastic.rules.choose_world`` has trimmed them to the attempt's size)."""
    return total_slots(world) if fixed is None else fixed


class Membership:
    """Which hosts each attempt of a job gets (``first``, then ``next`` after each attempt), how many
    ranks a world runs (``size``, by ``world_size``), and what watches a running attempt (``watch``: a
    thread, or None when nothing is polled, as for a fixed-size job)."""

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
        return world_size(world, self.num_proc)


def run_attempts(
    membership: Membership,
    launch: Launch,
    max_restarts: int,
    clock: Clock = time.monotonic,
    log: Log = print,
) -> tuple[History, JobResult]:
    """Run attempts until one finishes; ``(history, final JobResult)``. The one restart loop of
    every ``hvdkit run``: fixed-size jobs (FixedMembership) and elastic ones (ElasticMembership).

    ``launch(hosts, ranks, attempt, changes)`` returns the attempt (``ranks``: its world size, which
    ``membership.size`` decides; ``changes``: the membership changes so far) ready to run: an
    ``execute.Execution``, whose ``run(stop)`` returns its JobResult and whose ``progress()`` the
    watcher reads. Failures beyond ``max_restarts`` end the job; a stop to grow
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
        execution = launch(world, size, len(history.attempts) - 1, changes)
        stop, ended = StopRequest(), threading.Event()
        watcher = membership.watch(world, stop, ended, record, execution.progress, saved)
        try:
            result = execution.run(stop if watcher is not None else None)  # nothing can ask a fixed-size job to stop
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
