"""Reading what the ranks print through the launcher: their tagged lines and their wrappers' reports.

Pure (no processes): ``retag`` and ``LineDemux`` turn mpirun's/horovodrun's rank tags into
``[rank N] `` lines; ``RankReports`` takes the rank wrappers' start/step/exit reports out of them;
``launcher_report`` reads the launcher's own line about a rank that ended (for a rank whose wrapper
could not report). ``hvdkit.launcher.execute`` feeds them the launcher's output.
"""

from __future__ import annotations

import json
import re
import time
from typing import Any

from .rankwrap import MARK

__all__ = ["LineDemux", "RankReports", "launcher_report", "retag"]

# mpirun --tag-output: "[1,0]<stdout>:text"; horovodrun: "[0]<stdout>:text" (or with a timestamp).
_TAG = re.compile(r"^\[(?:\d+,)?(\d+)\]<(stdout|stderr)>:(.*)$", re.S)
_ANY_TAG = re.compile(r"\[(?:\d+,)?(\d+)\]<(stdout|stderr)>:")
# A rank wrapper's report, once retagged: "[rank 1] hvdkit-rank JOB {...}".
_REPORT = re.compile(rf"^\[rank (\d+)\] {MARK} (\S+) (\{{.*\}})\s*$")
# The launchers' own word on a rank that ended (Open MPI 4's errmgr; horovodrun --gloo's gloo_run).
_MPIRUN_SIGNAL = re.compile(
    r"^mpirun noticed that process rank (\d+) with PID \d+ on node (\S+) exited on signal (\d+)(?: \(.*\))?\.$"
)
_HOROVODRUN_EXIT = re.compile(r"^Process (\d+) exit with status code (-?\d+)\.$")


def retag(line: str) -> tuple[str, str]:
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


def launcher_report(text: str) -> dict[str, Any] | None:
    """What a launcher line says of a rank that ended, or None for any other line.

    ``mpirun noticed that process rank 1 with PID 0 on node n1 exited on signal 9 (Killed).`` gives
    ``{"rank": 1, "signal": 9, "host": "n1", "by": "mpirun"}``; horovodrun's
    ``Process 1 exit with status code 137.`` gives ``{"rank": 1, "exit_code": 137, "by": "horovodrun"}``
    (a negative code, a process killed by a signal, gives ``"signal"`` instead).
    """
    body = text.strip()
    m = _MPIRUN_SIGNAL.match(body)
    if m:
        return {"rank": int(m.group(1)), "signal": int(m.group(3)), "host": m.group(2), "by": "mpirun"}
    m = _HOROVODRUN_EXIT.match(body)
    if m:
        code = int(m.group(2))
        how = {"signal": -code} if code < 0 else {"exit_code": code}
        return {"rank": int(m.group(1)), **how, "by": "horovodrun"}
    return None


class LineDemux:
    """Reassembles each rank's lines from the launcher's tagged stream.

    mpirun tags every fragment a rank writes, not every line: a rank that writes "text" and "\\n"
    in two calls (unbuffered Python's print) arrives as ``[1,0]<stdout>:text[1,0]<stdout>:\\n``,
    and fragments of different ranks can share a physical line. ``feed`` takes one physical
    line and returns the complete ``(stream, "[rank N] text\\n")`` lines it finishes.
    """

    def __init__(self) -> None:
        self._partial = {}  # (rank, stream) -> text so far

    def feed(self, physical: str) -> list[tuple[str, str]]:
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

    def flush(self) -> list[tuple[str, str]]:
        return [self._emit(key) for key in list(self._partial) if self._partial[key]]

    def _emit(self, key):
        return _tagged(*key, self._partial.pop(key))


class RankReports:
    """What the rank wrappers of one job reported on their output: where each started, how it ended.

    A report is a line ``[rank N] hvdkit-rank JOB {json}`` (see ``hvdkit.launcher.rankwrap``); only
    those of this job are taken, and the rank is the launcher's tag, never what the line claims.
    The first report of each kind per rank counts; ``workers`` gathers every ``"worker"`` report (the workers of
    Horovod's elastic driver under ``--recovery in-process``, which come and go under one rank tag). ``ended`` is
    stamped with this host's clock on arrival, so ranks on hosts with different clocks are ordered as the launcher
    saw them end.
    """

    def __init__(self, job_id: str | None) -> None:
        self.job_id = job_id
        self.started = {}  # rank -> {"pid", "host", ...}
        self.workers = {}  # (host, pid) -> None, oldest first: the in-process workers that said where they run
        self.ended = {}  # rank -> {"exit_code", "signal", "host", "seconds", "ended", ...}
        self.first_step = self.last_step = None  # steps reported (``{"event": "step", "step": N}``)
        self.resumed_step = None  # the first step reported with ``"resumed": true``
        self.training = False  # a rank's PreemptionGuard reported (the ranks train and can stop cleanly)
        self.stopping = False  # and said they stop because asked (``"stopping": true``)
        self.saved_step = None  # the newest step rank 0 checkpointed (``{"event": "saved", "step": N}``)
        self.last_start = None  # time.monotonic() of the newest start report
        self.first_failure = None  # time.monotonic() of the first report of a rank that failed

    def resume_point(self) -> int | None:
        """The step the ranks resumed at: the one reported with ``"resumed": true``, else the first
        step reported less one (a loop that reports after every step), else None."""
        if self.resumed_step is not None:
            return self.resumed_step
        return None if self.first_step is None else self.first_step - 1

    def take(self, text: str) -> dict[str, Any] | None:
        """The record if ``text`` is one of this job's reports (then not shown to the user), else None."""
        m = _REPORT.match(text)
        if not (m and self.job_id and m.group(2) == self.job_id):
            return None
        try:
            record = json.loads(m.group(3))
        except ValueError:
            return None
        if not isinstance(record, dict) or record.get("event") not in ("start", "exit", "step", "saved", "worker"):
            return None
        record["rank"] = int(m.group(1))
        if record["event"] == "worker":
            host, pid = record.get("host"), record.get("pid")
            if isinstance(host, str) and host and isinstance(pid, int) and pid > 1:
                self.workers.pop((host, pid), None)
                self.workers[(host, pid)] = None  # the newest last
        elif record["event"] == "saved":
            if isinstance(record.get("step"), int):
                self.saved_step = max(record["step"], self.saved_step or 0)
        elif record["event"] == "step":
            self.training = True
            self.stopping = self.stopping or record.get("stopping") is True
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
