"""The one place that starts a job's launcher: run a Plan, stream rank-tagged output, report the outcome
(every other command hvdkit runs goes through ``child``)."""

from __future__ import annotations

import dataclasses
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from types import FrameType
from typing import Any, Protocol, TextIO

from ..core import env as _env
from .plan import Plan
from .quiet import OutputFilter
from .rank_output import LineDemux, RankReports, launcher_report, retag
from .rank_signals import (
    elastic_worker_pids,
    local_rank_pids,
    process_tree,
    reap,
    remote_rank_pids,
    remote_ranks_to_stop,
    signal_one_remote,
    signal_pids,
    signal_remote,
)
from .rankwrap import die_with_parent

__all__ = ["Execution", "JobResult", "RankProgress", "LineDemux", "RankReports", "retag", "signal_name"]

# Horovod's stall inspector lists missing ranks as "1: [tensor, ...]"; "1!:" once past the shutdown time.
_STALLED = re.compile(r"^\[rank \d+\] (\d+)!: \[(.*)\]")


class _StopRequest(Protocol):
    """What ``Execution.run`` reads of an ``attempts.StopRequest`` (named by its shape: the loop
    imports this module, so this module does not import the loop)."""

    reason: str | None
    hard: bool

    def is_set(self) -> bool: ...

    def wait(self, timeout: float | None) -> bool: ...


@dataclass(frozen=True)
class JobResult:
    """How a job ended."""

    exit_code: int
    failed_rank: int | None = None
    exit_status: int | None = None  # the failing rank's own exit code
    signal: int | None = None  # or the signal that killed it
    seconds: float = 0.0
    message: str = ""
    stalled_ranks: tuple = ()  # ranks Horovod's stall inspector found missing from collectives
    interrupted_by: int | None = None  # a signal the launcher itself received and passed on
    stop_reason: str | None = None  # why the launcher asked the ranks to stop (a StopRequest), if it did
    ranks_started_at: float | None = None  # time.monotonic() when the last rank reported its start
    failure_noticed_at: float | None = None  # time.monotonic() when the first failure report arrived
    resumed_step: int | None = None  # the step the ranks resumed at, if they report steps (PreemptionGuard)
    last_step: int | None = None  # the last step they reported
    guarded: bool = False  # the ranks reported through a PreemptionGuard (they can stop when asked)
    stopped_as_asked: bool = False  # and said they stop because asked (not that they finished)
    saved_step: int | None = None  # the newest step rank 0 reported checkpointed


def signal_name(num: int) -> str:
    try:
        return signal.Signals(num).name
    except ValueError:
        return f"signal {num}"


def _outcome(
    returncode: int,
    statuses: Mapping[int, Mapping[str, Any]],
    seconds: float,
    stalled: Iterable[int] = (),
    interrupted_by: int | None = None,
    started: Mapping[int, Mapping[str, Any]] | None = None,
    launcher_said: Mapping[str, Any] | None = None,
) -> JobResult:
    failures = [r for r in statuses.values() if r.get("exit_code") != 0]
    extra = {"seconds": seconds, "stalled_ranks": tuple(stalled), "interrupted_by": interrupted_by}
    if returncode != 0 and launcher_said is not None and launcher_said.get("rank") not in statuses:
        # The launcher failed and names a rank whose wrapper (the process it started) ended without a
        # report: the wrapper itself was killed, and first; the other ranks' reports are of the launcher
        # ending them. A launcher that succeeded had no failed rank, whatever it said of one: Horovod's
        # elastic driver drops a worker that ends (a removed host's exits 134) and the job goes on.
        first = launcher_said
        where = f" on {first['host']}" if first.get("host") else ""
        detail = f"{where} ({first['by']} says so; the rank's wrapper ended before it could report)"
    elif failures:
        first = min(failures, key=lambda r: r["ended"])
        detail = f" on {first.get('host', '?')} after {first.get('seconds', 0):.1f} s"
    else:
        # A stop sent to the whole job (SLURM's scancel signals mpirun too): every rank that started
        # ended cleanly, so the launcher's own status says nothing more.
        stopped_cleanly = interrupted_by is not None and started and set(started) <= set(statuses)
        if returncode == 0 or stopped_cleanly:
            return JobResult(0, **extra)
        return JobResult(
            returncode or 1,
            message=f"the launcher exited with {returncode} before any rank reported a failure (see its output above)",
            **extra,
        )
    rank, sig, code = first["rank"], first.get("signal"), first.get("exit_code")
    how = f"was killed by {signal_name(sig)}" if sig else f"exited with code {code}"
    exit_code = 128 + sig if sig else code
    message = f"rank {rank} {how}{detail}; job stopped"
    if stalled:
        names = ", ".join(f"rank {r}" for r in stalled)
        message = f"{names} stopped taking part in collectives (Horovod's stall inspector gave up waiting); " + message
    if interrupted_by:
        message = f"stopped by {signal_name(interrupted_by)} sent to the launcher; " + message
    return JobResult(exit_code, rank, code, sig, message=message, **extra)


@dataclass(frozen=True)
class RankProgress:
    """What the ranks of a running job have reported so far: a snapshot, taken by ``Execution.progress``."""

    started_at: float | None = None  # time.monotonic() of the newest start report
    last_step: int | None = None  # the newest step reported
    training: bool = False  # a PreemptionGuard reported: the ranks can stop cleanly when asked
    resumed_step: int | None = None  # the step the ranks resumed at, once rank 0 said it


class Execution:
    """One run of a Plan: the launcher process, what its ranks reported, and how a stop proceeds.

    ``run(stop)`` starts it and returns its JobResult; ``progress()`` may be called from another
    thread meanwhile (the elastic loop's watcher does) and returns a RankProgress snapshot. State:
    ``reports`` (the rank wrappers' reports), ``signals`` (signals the launcher received),
    ``stopping`` (a graceful stop is under way), ``stalled`` (ranks Horovod's stall inspector named),
    ``broken`` (output streams the user can no longer read). ``elastic_workers``: the plan runs Horovod's
    elastic driver, whose workers have no rank wrappers (``hvdkit run --recovery in-process``); a stop
    signals the workers on this host, found below the driver, as it would the wrappers.
    """

    def __init__(
        self,
        plan: Plan,
        job_id: str | None = None,
        out: TextIO | None = None,
        err: TextIO | None = None,
        grace: float = 30.0,
        forward_usr1: bool = True,
        elastic_workers: bool = False,
    ) -> None:
        self.plan, self.job_id, self.grace, self.forward_usr1 = plan, job_id, grace, forward_usr1
        self.elastic_workers = elastic_workers
        self.out, self.err = out or sys.stdout, err or sys.stderr
        # HVDKIT_LOG_LEVEL=DEBUG shows the ranks' start-up chatter and the launcher's own failure report
        level = _env.read_choice(_env.LOG_LEVEL, _env.LOG_LEVELS, _env.DEFAULT_LOG_LEVEL, upper=True)
        self.quiet = OutputFilter(verbose=level == "DEBUG")
        self.reports = RankReports(job_id)
        self.signals = []
        self.stopping = False
        self.stalled = []
        self.broken = set()
        self.launcher_said = None  # the launcher's first line about a rank that ended (launcher_report)
        self.proc = None
        self._timers = []
        self._finished = threading.Event()

    def progress(self) -> RankProgress:
        r = self.reports
        return RankProgress(r.last_start, r.last_step, r.training, r.resume_point())

    def run(self, stop: _StopRequest | None = None) -> JobResult:
        """Start the plan, stream every rank's output tagged with its rank, return a JobResult.

        ``job_id`` is the HVDKIT_JOB_ID the plan gave its rank wrappers: their reports (pid, how each
        rank ended) are taken from the stream, not shown. A SIGTERM, SIGINT or SIGHUP (a closed
        terminal or ssh session; unless ignored, as under nohup) sent to the launcher is a graceful
        stop: the ranks on this host get SIGTERM directly from their wrappers (and, with
        ``forward_usr1``, mpirun passes SIGUSR1 to every rank, also on other hosts; without it, as under
        horovodrun, ranks on other hosts get SIGTERM over ssh, by the pid and host they reported), so a
        PreemptionGuard can checkpoint the current step. After ``grace`` seconds, or at a second
        signal, the launcher itself is terminated. Afterwards no rank process of this job is left on
        this host. If this process dies without a word (SIGKILL, its process group killed), mpirun or
        horovodrun gets SIGTERM from the kernel and ends the job on every host. ``stop`` (a
        ``hvdkit.launcher.attempts.StopRequest``) lets another thread ask for the same graceful
        stop, or a hard one; the result names its reason.
        """
        start = time.perf_counter()
        self.proc = subprocess.Popen(
            list(self.plan.argv),
            env=self.plan.full_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,  # a Ctrl-C in the terminal reaches the launcher only; it decides
            preexec_fn=_end_with(os.getpid()),
            text=True,
            errors="replace",
            bufsize=1,
        )
        if stop is not None:
            threading.Thread(target=self._serve, args=(stop,), daemon=True).start()
        stops = [signal.SIGINT, signal.SIGTERM]
        if signal.getsignal(signal.SIGHUP) != signal.SIG_IGN:  # nohup: the user asked to outlive the terminal
            stops.append(signal.SIGHUP)
        previous = {s: signal.signal(s, self._on_signal) for s in stops}
        demux = LineDemux()
        try:
            for physical in self.proc.stdout:
                self._take(demux.feed(physical))
            self._take(demux.flush())
            returncode = self.proc.wait()
        finally:
            self._finished.set()
            for timer in self._timers:  # the job is over: never signal a pid that may be reused
                timer.cancel()
            for s, handler in previous.items():
                signal.signal(s, handler)
            reap(self.proc.pid, self._local_ranks())
        reports = self.reports
        interrupted = self.signals[0] if self.signals else None
        result = _outcome(
            returncode,
            reports.ended,
            time.perf_counter() - start,
            self.stalled,
            interrupted,
            reports.started,
            self.launcher_said,
        )
        self._show(self.quiet.end(rank_failed=result.failed_rank is not None))
        return dataclasses.replace(
            result,
            stop_reason=stop.reason if stop is not None and stop.is_set() and not self.signals else None,
            ranks_started_at=reports.last_start,
            failure_noticed_at=reports.first_failure,
            resumed_step=reports.resume_point(),
            last_step=reports.last_step,
            guarded=reports.training,
            stopped_as_asked=reports.stopping,
            saved_step=reports.saved_step,
        )

    def _local_ranks(self) -> list[int]:
        if self.elastic_workers and self.proc is not None:
            return elastic_worker_pids(self.proc.pid)
        return local_rank_pids(self.reports.started, self.job_id)

    def _stop_now(self) -> None:
        signal_pids(self._local_ranks(), signal.SIGTERM)
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass

    def _graceful(self) -> None:
        self.stopping = True
        signal_pids(self._local_ranks(), signal.SIGTERM)
        if self.forward_usr1:
            signal_pids([self.proc.pid], signal.SIGUSR1)
        elif self.elastic_workers:  # no worker here: one on another host that is still there, the newest first
            if not self._local_ranks():
                here = socket.gethostname()
                signal_one_remote([w for w in reversed(self.reports.workers) if w[0] != here], self.job_id)
        else:  # horovodrun passes no signal to other hosts: tell their ranks over ssh
            remote = remote_rank_pids(self.reports.started)
            signal_remote(remote_ranks_to_stop(remote, self._local_ranks(), self.reports.training), self.job_id)
        timer = threading.Timer(self.grace, self._stop_now)
        timer.daemon = True
        timer.start()
        self._timers.append(timer)

    def _on_signal(self, signum: int, _frame: FrameType | None) -> None:
        self.signals.append(signum)
        if len(self.signals) > 1 or self.stopping:
            self._stop_now()
            return
        self._graceful()

    def _serve(self, stop: _StopRequest) -> None:
        """Carry out a StopRequest made from another thread while the job runs."""
        while not self._finished.is_set():
            if stop.wait(0.2):
                if stop.hard:  # mpirun and its ssh to a vanished host wait forever: kill them all
                    signal_pids(self._local_ranks(), signal.SIGTERM)
                    signal_pids(process_tree(self.proc.pid), signal.SIGKILL)
                elif not (self.signals or self.stopping):
                    self._graceful()
                return

    def _take(self, lines: Iterable[tuple[str, str]]) -> None:
        """Lines from the launcher: rank reports are recorded, the rest filtered and shown."""
        for stream, text in lines:
            record = self.reports.take(text)
            if record:
                if record["event"] == "start" and self.stopping:  # started after the stop: stop it too
                    signal_pids(local_rank_pids({0: record}, self.job_id), signal.SIGTERM)
                    if not self.forward_usr1 and not self.reports.training:
                        signal_remote(remote_rank_pids({0: record}), self.job_id)
                continue
            m = _STALLED.match(text)
            if m and int(m.group(1)) not in self.stalled:
                self.stalled.append(int(m.group(1)))
            if self.launcher_said is None:
                self.launcher_said = launcher_report(text)
            self._show(self.quiet.feed(stream, text))

    def _show(self, lines: Iterable[tuple[str, str]]) -> None:
        for stream, text in lines:
            target = self.out if stream == "stdout" else self.err
            if target in self.broken:
                continue
            try:
                target.write(text)
                target.flush()
            except OSError:  # keep draining the ranks' output: a full pipe would stall them
                self.broken.add(target)


def _end_with(launcher_pid: int) -> Callable[[], None]:
    """For the launched mpirun/horovodrun: get SIGTERM when the launcher dies, however it dies.

    Both end the whole job on a SIGTERM, on every host; it reaches them although they run in
    their own session, where no signal to the launcher's process group or terminal does. Their
    output then has no reader: writing it must fail (EPIPE), not kill mpirun mid-way through
    ending the job (SIGPIPE), which would leave its session folder behind.
    """

    def arm() -> None:
        signal.signal(signal.SIGPIPE, signal.SIG_IGN)
        die_with_parent(signal.SIGTERM)
        if os.getppid() != launcher_pid:  # the launcher died before the request took effect
            os.kill(os.getpid(), signal.SIGKILL)

    return arm
