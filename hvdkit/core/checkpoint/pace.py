"""A background write held to a share of a core (``writer_priority="paced"``), until something waits for it.

The threads of a write (the writer, which computes the zip CRC and copies into the file, and the hash thread)
each measure their own CPU time (``time.thread_time``) and, after each piece of work, sleep long enough that
the piece's work is ``share`` of the time it took in all: work ``w`` is followed by ``w * (1 - share) / share``
of sleep. So a write on a machine whose cores all train takes about ``share`` of a core per thread from the
training, whatever the scheduler does with nice values, and lasts ``1 / share`` times its CPU time. Once
anything waits for the write (the next save, ``wait()``, the end of ``fit``, a preemption, exit), ``hurry`` is
set and the rest of the write runs at full speed.

``background.BackgroundWrites`` sets the pace of its write thread (``paced``); ``arrays`` asks for it
(``current``) in that thread when it starts writing, and makes a ``Pacer`` per thread of the write.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator

__all__ = ["Pacer", "current", "paced"]

_LOCAL = threading.local()


@contextlib.contextmanager
def paced(share: float | None, hurry: threading.Event) -> Iterator[None]:
    """Within the block, writes made by this thread keep each of their threads to ``share`` of a core (None: not
    paced) until ``hurry`` is set."""
    _LOCAL.pace = (share, hurry) if share else None
    try:
        yield
    finally:
        _LOCAL.pace = None


def current() -> tuple[float, threading.Event] | None:
    """The pace ``(share, hurry)`` set for this thread's writes, or None."""
    return getattr(_LOCAL, "pace", None)


class Pacer:
    """One thread's pace: ``start()`` in that thread, then ``rest()`` after each piece of its work.

    ``clock`` is the thread's CPU time (a test passes its own); the rest is waited on ``hurry``, so setting it ends
    a rest at once and leaves every later one out.
    """

    def __init__(self, share: float, hurry: threading.Event, clock: Callable[[], float] = time.thread_time) -> None:
        if not 0.0 < share <= 1.0:
            raise ValueError(f"a pace is a share of a core in (0, 1] (got {share!r})")
        self._sleep_per_work = (1.0 - share) / share
        self._hurry = hurry
        self._clock = clock
        self._mark = 0.0
        self.rested = 0.0  # seconds of rest asked for so far

    def start(self) -> None:
        self._mark = self._clock()

    def rest(self) -> None:
        now = self._clock()
        work, self._mark = now - self._mark, now
        if work > 0.0 and self._sleep_per_work and not self._hurry.is_set():
            pause = work * self._sleep_per_work
            self.rested += pause
            self._hurry.wait(pause)
            self._mark = self._clock()  # the wait's own CPU is not the write's work
