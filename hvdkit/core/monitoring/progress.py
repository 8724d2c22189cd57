"""A dependency-free progress display for rank 0: steps, samples per second and ETA."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from typing import TextIO

from .. import env as _env

__all__ = ["Progress"]


def _fmt_time(seconds):
    seconds = int(max(0, seconds))
    m, s = divmod(seconds, 60)
    h, m = divmod(m, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m:02d}:{s:02d}"


class Progress:
    """Progress of ``total`` steps on one rank (pass ``show=is_rank0``).

    Where ``show`` is true, HVDKIT_PROGRESS decides, and by default it is on when the stream is a
    terminal. On a terminal it redraws one line; elsewhere (a pipe, under ``hvdkit run``) it prints
    a line at most every ``interval`` seconds, so long work shows progress and short work stays quiet.

    Env: HVDKIT_PROGRESS (auto, 1/on, 0/off); HVDKIT_PROGRESS_INTERVAL (seconds between lines
    when not a terminal, when ``interval`` is not given; default 10).
    """

    def __init__(
        self,
        total: int,
        desc: str = "",
        show: bool = True,
        stream: TextIO | None = None,
        interval: float | None = None,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.stream = stream or sys.stderr
        tty = hasattr(self.stream, "isatty") and self.stream.isatty()
        wanted = _env.flag(_env.PROGRESS, default=tty)
        self.enabled = bool(show and wanted)
        self.tty = tty
        self.total = max(1, int(total))
        self.desc = desc
        self.done = 0
        self.samples = 0
        self.interval = interval if interval is not None else _env.seconds(_env.PROGRESS_INTERVAL, 10.0)
        self.clock = clock
        self.unit = "samples"  # what update(samples=...) counts
        self.start = self._last = clock()

    def update(self, steps: int = 1, samples: int = 0) -> None:
        self.done += steps
        self.samples += samples
        if not self.enabled:
            return
        frac = min(1.0, self.done / self.total)
        if self.tty:
            if self.clock() - self._last >= 0.1 or self.done >= self.total:  # ~10 redraws a second
                self._last = self.clock()
                self._draw(frac, end="")
        elif self.clock() - self._last >= self.interval:
            self._last = self.clock()
            self._draw(frac, end="\n")

    def _draw(self, frac, end):
        elapsed = self.clock() - self.start
        rate = self.samples / elapsed if elapsed > 0 else 0.0
        eta = elapsed * (1 - frac) / frac if frac > 0 else 0.0
        width = 24
        bar = "#" * int(frac * width) + "." * (width - int(frac * width))
        line = (
            f"{self.desc} [{bar}] {self.done}/{self.total} {frac:4.0%} "
            f"{rate:,.0f} {self.unit}/s elapsed {_fmt_time(elapsed)} eta {_fmt_time(eta)}"
        )
        self.stream.write(("\r" + line) if self.tty else line + end)
        self.stream.flush()

    def close(self) -> None:
        if self.enabled and self.tty:
            self.stream.write(os.linesep)
            self.stream.flush()
