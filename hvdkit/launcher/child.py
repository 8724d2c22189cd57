"""One child process of a tool, in its own session: started, read line by line, ended by its group.

``execute`` starts a job's launcher (rank reports, signal forwarding, the stop of a whole job); every
other command hvdkit runs to its end goes through here: a tune trial's ``hvdkit run``, a benchmark
job, doctor's checks. Each child leads its own process group, so a stop reaches everything it
started, by the group's id and never by a name; a timeout is a graceful stop (SIGTERM to the group,
SIGKILL after a grace period).
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import IO

__all__ = ["Child", "ChildResult", "run_child"]

DEFAULT_GRACE = 10.0


@dataclass(frozen=True)
class ChildResult:
    """How a child ended: its exit code (``-N``: killed by signal N), all its output (stdout and
    stderr, in the order they came), and whether the timeout stopped it."""

    exit_code: int
    output: str
    timed_out: bool = False


class Child:
    """``argv`` started in its own session (the leader of its own process group), stdin closed.

    Its stdout and stderr go together to ``output`` (a binary file) or, without one, to a pipe read
    as text with ``lines()``. ``env`` is the child's whole environment (default: this process's).
    """

    def __init__(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        output: IO[bytes] | None = None,
        cwd: str | None = None,
    ) -> None:
        self.proc = subprocess.Popen(
            list(argv),
            env=None if env is None else dict(env),
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE if output is None else output,
            stderr=subprocess.STDOUT,
            text=output is None,
            errors="replace" if output is None else None,
            start_new_session=True,  # its own process group: ended by its id, never by a name
        )
        self.pid = self.proc.pid
        self.stopped_at: float | None = None  # time.monotonic() of the first terminate()

    def lines(self) -> Iterator[str]:
        """Each line of its output as it comes (with its newline), until every process of the
        group that holds the pipe has closed it."""
        if self.proc.stdout is None:
            raise RuntimeError("this child's output goes to a file, not to a pipe")
        with self.proc.stdout:
            yield from self.proc.stdout

    def poll(self) -> int | None:
        """Its exit code, or None while it runs."""
        return self.proc.poll()

    def wait(self, timeout: float | None = None) -> int:
        """Its exit code once it has ended (``subprocess.TimeoutExpired`` after ``timeout`` seconds)."""
        return self.proc.wait(timeout)

    def terminate(self, group: bool = True) -> None:
        """SIGTERM to its process group (``group=False``: to the leader alone, which then stops what it
        started its own way, as ``hvdkit run`` does); remembers when, in ``stopped_at``."""
        if self.stopped_at is None:
            self.stopped_at = time.monotonic()
        self._signal(signal.SIGTERM, group)

    def kill(self) -> int:
        """SIGKILL to its process group; its exit code."""
        self._signal(signal.SIGKILL, True)
        return self.proc.wait()

    def stop(self, grace: float = DEFAULT_GRACE) -> int:
        """The graceful stop: SIGTERM to the group, then SIGKILL to whatever of it still runs ``grace``
        seconds later (at once once none of it runs); its exit code."""
        deadline = time.monotonic() + grace
        self.terminate()
        try:
            self.proc.wait(grace)
        except subprocess.TimeoutExpired:
            pass
        while self._group_alive() and time.monotonic() < deadline:  # what the leader started, ending
            time.sleep(0.05)
        return self.kill()

    def _group_alive(self) -> bool:
        try:
            os.killpg(self.pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:  # pragma: no cover - a member changed its user: it still runs
            return True
        return True

    def _signal(self, sig: int, group: bool) -> None:
        try:
            if group:
                # A group id is not reused while a member lives: this reaches the child's own processes only.
                os.killpg(self.pid, sig)
            elif self.proc.poll() is None:
                os.kill(self.pid, sig)
        except ProcessLookupError:  # already gone
            pass


def run_child(
    argv: Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    timeout: float | None = None,
    grace: float = DEFAULT_GRACE,
    on_line: Callable[[str], None] | None = None,
    cwd: str | None = None,
) -> ChildResult:
    """Run ``argv`` (a ``Child``) to its end; its ``ChildResult``.

    ``on_line(line)`` gets each line of its output as it comes, in order. After ``timeout`` seconds
    the child gets the graceful stop (``Child.stop(grace)``) and the result says ``timed_out``.
    Raises OSError when ``argv[0]`` cannot be started (``FileNotFoundError`` when not found).
    """
    child = Child(argv, env=env, cwd=cwd)
    expired, finished = threading.Event(), threading.Event()

    def expire() -> None:
        if not finished.is_set():  # the leader runs, or its output is still open: something it started runs
            expired.set()
            child.stop(grace)

    timer = threading.Timer(timeout, expire) if timeout is not None else None
    if timer is not None:
        timer.daemon = True
        timer.start()
    lines = []
    try:
        for line in child.lines():
            lines.append(line)
            if on_line is not None:
                on_line(line)
        code = child.wait()
        finished.set()
    except BaseException:
        child.kill()  # the caller gives up (an error in on_line, Ctrl-C): leave nothing behind
        raise
    finally:
        if timer is not None:
            timer.cancel()
    return ChildResult(code, "".join(lines), expired.is_set())
