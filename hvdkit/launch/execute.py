"""The one place that starts processes: run a Plan, stream rank-tagged output, report the outcome."""

import dataclasses
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass

from ..core import env as _env
from .plan import Plan
from .quiet import OutputFilter
from .rankwrap import MARK, die_with_parent

__all__ = ["JobResult", "LineDemux", "RankReports", "local_rank_pids", "run", "retag", "signal_name"]

# mpirun --tag-output: "[1,0]<stdout>:text"; horovodrun: "[0]<stdout>:text" (or with a timestamp).
_TAG = re.compile(r"^\[(?:\d+,)?(\d+)\]<(stdout|stderr)>:(.*)$", re.S)
_ANY_TAG = re.compile(r"\[(?:\d+,)?(\d+)\]<(stdout|stderr)>:")
# Horovod's stall inspector lists missing ranks as "1: [tensor, ...]"; "1!:" once past the shutdown time.
_STALLED = re.compile(r"^\[rank \d+\] (\d+)!: \[(.*)\]")
# A rank wrapper's report, once retagged: "[rank 1] hvdkit-rank JOB {...}".
_REPORT = re.compile(rf"^\[rank (\d+)\] {MARK} (\S+) (\{{.*\}})\s*$")


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


def retag(line):
    """``(stream, text)`` with the launcher's rank tag turned into ``[rank N] ``.

    Lines that hvdkit's logger already prefixed with ``[rank N/size]`` keep just that prefix;
    untagged lines come from the launcher itself and go to stderr.
    """
    m = _TAG.match(line)
    if not m:
        return "stderr", line
    return _tagged(m.group(1), m.group(2), m.group(3))


def _tagged(rank, stream, text):
    if not text.endswith("\n"):
        text += "\n"
    if text.startswith(f"[rank {rank}/"):
        return stream, text
    return stream, f"[rank {rank}] {text}"


class LineDemux:
    """Reassembles each rank's lines from the launcher's tagged stream.

    mpirun tags every fragment a rank writes, not every line: a rank that writes "text" and "\\n"
    in two calls (unbuffered Python's print) arrives as ``[1,0]<stdout>:text[1,0]<stdout>:\\n``,
    and fragments of different ranks can share a physical line. ``feed`` takes one physical
    line and returns the complete ``(stream, "[rank N] text\\n")`` lines it finishes.
    """

    def __init__(self):
        self._partial = {}  # (rank, stream) -> text so far

    def feed(self, physical):
        marks = list(_ANY_TAG.finditer(physical))
        if not marks:
            return [("stderr", physical if physical.endswith("\n") else physical + "\n")]
        done = []
        if marks[0].start() > 0:  # launcher text before the first tag
            done.append(("stderr", physical[: marks[0].start()] + "\n"))
        for i, m in enumerate(marks):
            key = (m.group(1), m.group(2))
            end = marks[i + 1].start() if i + 1 < len(marks) else len(physical)
            self._partial[key] = self._partial.get(key, "") + physical[m.end() : end]
            if self._partial[key].endswith("\n"):
                done.append(self._emit(key))
        return done

    def flush(self):
        return [self._emit(key) for key in list(self._partial) if self._partial[key]]

    def _emit(self, key):
        return _tagged(*key, self._partial.pop(key))


class RankReports:
    """What the rank wrappers of one job reported on their output: where each started, how it ended.

    A report is a line ``[rank N] hvdkit-rank JOB {json}`` (see ``hvdkit.launch.rankwrap``); only
    those of this job are taken, and the rank is the launcher's tag, never what the line claims.
    The first report of each kind per rank counts. ``ended`` is stamped with this host's clock on
    arrival, so ranks on hosts with different clocks are ordered as the launcher saw them end.
    """

    def __init__(self, job_id):
        self.job_id = job_id
        self.started = {}  # rank -> {"pid", "host", ...}
        self.ended = {}  # rank -> {"exit_code", "signal", "host", "seconds", "ended", ...}
        self.first_step = self.last_step = None  # steps reported (``{"event": "step", "step": N}``)
        self.resumed_step = None  # the first step reported with ``"resumed": true``
        self.training = False  # a rank's PreemptionGuard reported (the ranks train and can stop cleanly)
        self.last_start = None  # time.monotonic() of the newest start report
        self.first_failure = None  # time.monotonic() of the first report of a rank that failed

    def resume_point(self):
        """The step the ranks resumed at: the one reported with ``"resumed": true``, else the first
        step reported less one (a loop that reports after every step), else None."""
        if self.resumed_step is not None:
            return self.resumed_step
        return None if self.first_step is None else self.first_step - 1

    def take(self, text):
        """The record if ``text`` is one of this job's reports (then not shown to the user), else None."""
        m = _REPORT.match(text)
        if not (m and self.job_id and m.group(2) == self.job_id):
            return None
        try:
            record = json.loads(m.group(3))
        except ValueError:
            return None
        if not isinstance(record, dict) or record.get("event") not in ("start", "exit", "step"):
            return None
        record["rank"] = int(m.group(1))
        if record["event"] == "step":
            self.training = True
            if isinstance(record.get("step"), int):
                if record.get("resumed") is True and self.resumed_step is None:
                    self.resumed_step = record["step"]
                self.first_step = record["step"] if self.first_step is None else self.first_step
                self.last_step = record["step"]
        elif record["event"] == "start":
            self.started.setdefault(record["rank"], record)
            self.last_start = time.monotonic()
        else:
            record["ended"] = time.time()
            self.ended.setdefault(record["rank"], record)
            if record.get("exit_code") != 0 and self.first_failure is None:
                self.first_failure = time.monotonic()
        return record


def local_rank_pids(started, job_id, host=None):
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
            if b"hvdkit.launch.rankwrap" not in f.read():
                return False
        with open(f"/proc/{pid}/environ", "rb") as f:  # readable for our own processes (and root)
            return f"{_env.JOB_ID}={job_id}".encode() in f.read().split(b"\0")
    except OSError:
        return False


def _signal_pids(pids, sig):
    for pid in pids:
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def signal_name(num):
    try:
        return signal.Signals(num).name
    except ValueError:
        return f"signal {num}"


def _outcome(returncode, statuses, seconds, stalled=(), interrupted_by=None, started=None):
    failures = [r for r in statuses.values() if r.get("exit_code") != 0]
    extra = {"seconds": seconds, "stalled_ranks": tuple(stalled), "interrupted_by": interrupted_by}
    if not failures:
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
    first = min(failures, key=lambda r: r["ended"])
    rank, sig, code = first["rank"], first.get("signal"), first.get("exit_code")
    how = f"was killed by {signal_name(sig)}" if sig else f"exited with code {code}"
    exit_code = 128 + sig if sig else code
    message = f"rank {rank} {how} on {first.get('host', '?')} after {first.get('seconds', 0):.1f} s; job stopped"
    if stalled:
        names = ", ".join(f"rank {r}" for r in stalled)
        message = f"{names} stopped taking part in collectives (Horovod's stall inspector gave up waiting); " + message
    if interrupted_by:
        message = f"stopped by {signal_name(interrupted_by)} sent to the launcher; " + message
    return JobResult(exit_code, rank, code, sig, message=message, **extra)


def run(plan: Plan, job_id=None, out=None, err=None, grace=30.0, forward_usr1=True, stop=None):
    """Start ``plan``, stream every rank's output tagged with its rank, return a JobResult.

    ``job_id`` is the HVDKIT_JOB_ID the plan gave its rank wrappers: their reports (pid, how each
    rank ended) are taken from the stream, not shown. A SIGTERM, SIGINT or SIGHUP (a closed
    terminal or ssh session; unless ignored, as under nohup) sent to the launcher is a graceful
    stop: the ranks on this host get SIGTERM directly from their wrappers (and, with
    ``forward_usr1``, mpirun passes SIGUSR1 to every rank, also on other hosts), so a
    PreemptionGuard can checkpoint the current step. After ``grace`` seconds, or at a second
    signal, the launcher itself is terminated. Afterwards no rank process of this job is left on
    this host. If this process dies without a word (SIGKILL, its process group killed), mpirun or
    horovodrun gets SIGTERM from the kernel and ends the job on every host. ``stop`` (a
    ``hvdkit.launch.elastic_run.StopRequest``) lets another thread ask for the same graceful stop,
    or a hard one; the result names its reason.
    """
    out = out or sys.stdout
    err = err or sys.stderr
    # HVDKIT_LOG_LEVEL=DEBUG shows the ranks' start-up chatter and the launcher's own failure report
    quiet = OutputFilter(verbose=_env.read_choice(_env.LOG_LEVEL, _env.LOG_LEVELS, _env.DEFAULT_LOG_LEVEL, upper=True) == "DEBUG")
    start = time.perf_counter()
    proc = subprocess.Popen(
        list(plan.argv),
        env=plan.full_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        start_new_session=True,  # a Ctrl-C in the terminal reaches the launcher only; it decides
        preexec_fn=_end_with(os.getpid()),
        text=True,
        errors="replace",
        bufsize=1,
    )
    reports = RankReports(job_id)
    received, timers = [], []

    def local_ranks():
        return local_rank_pids(reports.started, job_id)

    def stop_now():
        _signal_pids(local_ranks(), signal.SIGTERM)
        try:
            os.killpg(proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass

    stopping = []  # a graceful stop is under way (a signal or a StopRequest)

    def graceful():
        stopping.append(True)
        _signal_pids(local_ranks(), signal.SIGTERM)
        if forward_usr1:
            _signal_pids([proc.pid], signal.SIGUSR1)
        timers.append(threading.Timer(grace, stop_now))
        timers[-1].daemon = True
        timers[-1].start()

    def forward(signum, _frame):
        received.append(signum)
        if len(received) > 1 or stopping:
            stop_now()
            return
        graceful()

    finished = threading.Event()

    def on_request():
        while not finished.is_set():
            if stop.wait(0.2):
                if stop.hard:  # mpirun and its ssh to a vanished host wait forever: kill them all
                    _signal_pids(local_ranks(), signal.SIGTERM)
                    _signal_pids(_tree(proc.pid), signal.SIGKILL)
                elif not (received or stopping):
                    graceful()
                return

    if stop is not None:
        threading.Thread(target=on_request, daemon=True).start()

    stops = [signal.SIGINT, signal.SIGTERM]
    if signal.getsignal(signal.SIGHUP) != signal.SIG_IGN:  # nohup: the user asked to outlive the terminal
        stops.append(signal.SIGHUP)
    previous = {s: signal.signal(s, forward) for s in stops}
    demux = LineDemux()
    stalled = []
    broken = set()  # streams the user can no longer read (a closed terminal)

    def write(lines):
        for stream, text in lines:
            record = reports.take(text)
            if record and stop is not None:
                stop.ranks_started_at, stop.last_step, stop.training = reports.last_start, reports.last_step, reports.training
            if record:
                if record["event"] == "start" and stopping:  # started after the stop: stop it too
                    _signal_pids(local_rank_pids({0: record}, job_id), signal.SIGTERM)
                continue
            m = _STALLED.match(text)
            if m and int(m.group(1)) not in stalled:
                stalled.append(int(m.group(1)))
            show(quiet.feed(stream, text))

    def show(lines):
        for stream, text in lines:
            target = out if stream == "stdout" else err
            if target in broken:
                continue
            try:
                target.write(text)
                target.flush()
            except OSError:  # keep draining the ranks' output: a full pipe would stall them
                broken.add(target)

    try:
        for physical in proc.stdout:
            write(demux.feed(physical))
        write(demux.flush())
        returncode = proc.wait()
    finally:
        finished.set()
        for timer in timers:  # the job is over: never signal a pid that may be reused
            timer.cancel()
        for s, handler in previous.items():
            signal.signal(s, handler)
        _reap(proc.pid, local_ranks())
    seconds = time.perf_counter() - start
    result = _outcome(returncode, reports.ended, seconds, stalled, received[0] if received else None, reports.started)
    show(quiet.end(rank_failed=result.failed_rank is not None))
    return dataclasses.replace(
        result,
        stop_reason=stop.reason if stop is not None and stop.is_set() and not received else None,
        ranks_started_at=reports.last_start,
        failure_noticed_at=reports.first_failure,
        resumed_step=reports.resume_point(),
        last_step=reports.last_step,
    )


def _end_with(launcher_pid):
    """For the launched mpirun/horovodrun: get SIGTERM when the launcher dies, however it dies.

    Both end the whole job on a SIGTERM, on every host; it reaches them although they run in
    their own session, where no signal to the launcher's process group or terminal does. Their
    output then has no reader: writing it must fail (EPIPE), not kill mpirun mid-way through
    ending the job (SIGPIPE), which would leave its session folder behind.
    """

    def arm():
        signal.signal(signal.SIGPIPE, signal.SIG_IGN)
        die_with_parent(signal.SIGTERM)
        if os.getppid() != launcher_pid:  # the launcher died before the request took effect
            os.kill(os.getpid(), signal.SIGKILL)

    return arm


def _tree(pid):
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


def _reap(pgid, rank_pids):
    """Kill whatever the job left behind on this host: the launcher's group and any rank wrapper
    still running (their commands die with them)."""
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    _signal_pids(rank_pids, signal.SIGKILL)
