"""The one place that starts processes: run a Plan, stream rank-tagged output, report the outcome."""

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass

from .plan import Plan

__all__ = ["JobResult", "LineDemux", "run", "read_statuses", "retag", "signal_name"]

# mpirun --tag-output: "[1,0]<stdout>:text"; horovodrun: "[0]<stdout>:text" (or with a timestamp).
_TAG = re.compile(r"^\[(?:\d+,)?(\d+)\]<(stdout|stderr)>:(.*)$", re.S)
_ANY_TAG = re.compile(r"\[(?:\d+,)?(\d+)\]<(stdout|stderr)>:")
# Horovod's stall inspector lists missing ranks as "1: [tensor, ...]"; "1!:" once past the shutdown time.
_STALLED = re.compile(r"^\[rank \d+\] (\d+)!: \[(.*)\]")


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


def read_statuses(status_dir):
    """Every rank's exit record written by ``hvdkit.launch.rankwrap``, by rank."""
    records = {}
    if not status_dir or not os.path.isdir(status_dir):
        return records
    for name in os.listdir(status_dir):
        if name.startswith("rank-") and name.endswith(".json"):
            try:
                with open(os.path.join(status_dir, name)) as f:
                    rec = json.load(f)
                records[int(rec["rank"])] = rec
            except (OSError, ValueError, KeyError):
                continue
    return records


def local_rank_pids(status_dir):
    """Pids of the rank wrappers on this host that are still running (from their ``rank-N.pid``)."""
    pids = []
    if not status_dir or not os.path.isdir(status_dir):
        return pids
    for name in os.listdir(status_dir):
        if not (name.startswith("rank-") and name.endswith(".pid")):
            continue
        try:
            with open(os.path.join(status_dir, name)) as f:
                pid = int(f.read().split()[0])
            with open(f"/proc/{pid}/cmdline", "rb") as f:  # still our wrapper, not a reused pid
                if b"hvdkit.launch.rankwrap" in f.read():
                    pids.append(pid)
        except (OSError, ValueError, IndexError):
            continue
    return pids


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


def _outcome(returncode, statuses, seconds, stalled=(), interrupted_by=None):
    failures = [r for r in statuses.values() if r.get("exit_code") != 0]
    extra = {"seconds": seconds, "stalled_ranks": tuple(stalled), "interrupted_by": interrupted_by}
    if not failures:
        if returncode == 0:
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


def run(plan: Plan, status_dir=None, out=None, err=None, grace=30.0, forward_usr1=True):
    """Start ``plan``, stream every rank's output tagged with its rank, return a JobResult.

    A SIGTERM or SIGINT sent to the launcher is a graceful stop: the ranks on this host get SIGTERM
    directly from their wrappers (and, with ``forward_usr1``, mpirun passes SIGUSR1 to every rank,
    also on other hosts), so a PreemptionGuard can checkpoint the current step. After ``grace``
    seconds, or at a second signal, the launcher itself is terminated. Afterwards no rank
    process of this job is left on this host.
    """
    out = out or sys.stdout
    err = err or sys.stderr
    start = time.perf_counter()
    proc = subprocess.Popen(
        list(plan.argv),
        env=plan.full_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
        text=True,
        errors="replace",
        bufsize=1,
    )

    received, timers = [], []

    def stop_now():
        _signal_pids(local_rank_pids(status_dir), signal.SIGTERM)
        try:
            os.killpg(proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass

    def forward(signum, _frame):
        received.append(signum)
        if len(received) > 1:
            stop_now()
            return
        _signal_pids(local_rank_pids(status_dir), signal.SIGTERM)
        if forward_usr1:
            _signal_pids([proc.pid], signal.SIGUSR1)
        timers.append(threading.Timer(grace, stop_now))
        timers[-1].daemon = True
        timers[-1].start()

    previous = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM)}
    demux = LineDemux()
    stalled = []

    def write(lines):
        for stream, text in lines:
            m = _STALLED.match(text)
            if m and int(m.group(1)) not in stalled:
                stalled.append(int(m.group(1)))
            target = out if stream == "stdout" else err
            target.write(text)
            target.flush()

    try:
        for physical in proc.stdout:
            write(demux.feed(physical))
        write(demux.flush())
        returncode = proc.wait()
    finally:
        for timer in timers:  # the job is over: never signal a pid that may be reused
            timer.cancel()
        for s, handler in previous.items():
            signal.signal(s, handler)
        _reap(proc.pid, status_dir)
    seconds = time.perf_counter() - start
    return _outcome(returncode, read_statuses(status_dir), seconds, stalled, received[0] if received else None)


def _reap(pgid, status_dir):
    """Kill whatever the job left behind on this host: the launcher's group and any rank wrapper
    still running (their commands die with them)."""
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    _signal_pids(local_rank_pids(status_dir), signal.SIGKILL)
