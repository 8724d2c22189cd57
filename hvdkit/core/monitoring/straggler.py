"""Straggler report: which rank's step compute time holds the whole job back.

What is measured. In synchronous data-parallel training every rank leaves each gradient allreduce
at about the same moment, so the wall time of a whole step is the same on every rank: a fast rank
just waits longer inside the allreduce. A slow rank (a busy host, a slow disk, thermal throttling)
shows in its *compute time*: the time from the end of one synchronisation to the start of the next
(data loading, forward, backward, anything else the rank does in the step). So the monitor records,
per step::

    step time = wall time of the step - time waited inside collectives during it

The adapters report the allreduce wait for you (``hvdkit.torch.StragglerMonitor(optimizer=opt)``
times the optimizer's ``synchronize()``; ``hvdkit.keras.StragglerMonitorCallback`` reads the time
``hvdkit.keras.DistributedOptimizer`` spent in its allreduce), so wrapping the whole step is the simple
default that still points at the slow rank. Without that, wrap only the compute part of the step
(``with monitor.step():`` around data loading, forward and backward, not around ``optimizer.step()``),
or report waits yourself with ``monitor.waiting()``/``add_wait()``: a bracket that contains an
unreported wait makes every rank look equally slow.

Slowdown. At ``epoch_end()`` every rank's median step time is gathered. The slowest rank is the one
with the largest median; its slowdown is its median divided by the median of the *other* ranks'
medians (1.0 when fewer than two ranks timed a step). Excluding the slowest rank from the
denominator keeps the number meaningful for 2 ranks, where a median over both would cap it below 2.
A slowdown above ``threshold`` (default 1.2, i.e. 20% slower) is a straggler: rank 0 logs a WARNING
naming the rank, its host and the slowdown; otherwise an INFO line.
"""

from __future__ import annotations

import logging
import math
import socket
import statistics
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, Self

from .. import env as _env
from ..errors import ConfigError
from ..log import get_logger
from ..options import check_number_above, check_number_at_least

if TYPE_CHECKING:
    from ..comm import Communicator

__all__ = ["RankTiming", "StragglerMonitor", "StragglerReport", "build_report", "straggler_threshold"]

_log = get_logger("straggler")


_THRESHOLD = "a finite number > 1.0, the slowdown above which a rank is a straggler"
_THRESHOLD_HINT = "e.g. 1.2 reports a rank 20% slower than the others"


def straggler_threshold(value: float | None = None, environ: Mapping[str, str] | None = None) -> float:
    """The straggler threshold: ``value``, else HVDKIT_STRAGGLER_THRESHOLD, else 1.2.

    It must be a finite number > 1.0 (the slowdown above which a rank is reported).
    Env: HVDKIT_STRAGGLER_THRESHOLD.
    """
    if value is None:
        kind = _env.number(1.0, _THRESHOLD)
        return _env.read(_env.STRAGGLER_THRESHOLD, kind, _env.DEFAULT_STRAGGLER_THRESHOLD, environ)
    return check_number_above("threshold", value, 1.0, _THRESHOLD_HINT, what=_THRESHOLD)


@dataclass(frozen=True)
class RankTiming:
    """One rank's step times over an epoch (seconds; NaN when it timed no step)."""

    rank: int
    host: str
    steps: int
    median_s: float
    mean_s: float


@dataclass(frozen=True)
class StragglerReport:
    """Every rank's step times and the slowest rank, the same on every rank."""

    name: str
    epoch: object  # the epoch given to epoch_end(), or None
    ranks: tuple
    slowest_rank: object  # int, or None when no rank timed a step
    slowdown: float
    threshold: float

    @property
    def exceeded(self) -> bool:
        """True when the slowest rank's slowdown is above the threshold."""
        return self.slowdown > self.threshold

    @property
    def straggler(self) -> int | None:
        """The straggling rank, or None when no rank is above the threshold."""
        return self.slowest_rank if self.exceeded else None

    @property
    def slowest(self) -> RankTiming | None:
        """The slowest rank's RankTiming (None when no rank timed a step)."""
        return None if self.slowest_rank is None else self.ranks[self.slowest_rank]

    def typical_s(self) -> float:
        """The median of the other ranks' median step times (NaN with fewer than two timed ranks)."""
        others = [t.median_s for t in self.ranks if t.steps > 0 and t.rank != self.slowest_rank]
        return statistics.median(others) if others else math.nan

    def summary(self) -> str:
        """One line naming the slowest rank, its host and its slowdown."""
        where = f"{self.name}" + (f" epoch {self.epoch}" if self.epoch is not None else "")
        s = self.slowest
        if s is None:
            return f"{where}: no rank timed a step"
        times = f"median step {s.median_s * 1e3:.1f} ms vs {self.typical_s() * 1e3:.1f} ms on the other ranks"
        verdict = "is a straggler" if self.exceeded else "is the slowest rank, within the threshold"
        return (
            f"{where}: rank {s.rank} (host {s.host or 'unknown'}) {verdict}: {self.slowdown:.2f}x slower "
            f"({times}, {s.steps} steps; threshold {self.threshold:g})"
        )

    def as_dict(self) -> dict[str, Any]:
        """Plain data (for JSON or a tracker)."""
        return {
            "name": self.name,
            "epoch": self.epoch,
            "ranks": [asdict(t) for t in self.ranks],
            "slowest_rank": self.slowest_rank,
            "slowdown": self.slowdown,
            "threshold": self.threshold,
            "straggler": self.straggler,
        }


def build_report(
    timings: Iterable[RankTiming], threshold: float, name: str = "train", epoch: int | None = None
) -> StragglerReport:
    """The StragglerReport of every rank's RankTiming (indexed by rank), as defined in this module's doc."""
    timings = tuple(sorted(timings, key=lambda t: t.rank))
    timed = [t for t in timings if t.steps > 0]
    if not timed:
        return StragglerReport(name, epoch, timings, None, 1.0, threshold)
    slowest = max(timed, key=lambda t: (t.median_s, -t.rank))  # ties: the lowest rank
    others = [t.median_s for t in timed if t.rank != slowest.rank]
    if not others:
        slowdown = 1.0
    else:
        typical = statistics.median(others)
        if typical > 0:
            slowdown = slowest.median_s / typical
        else:
            slowdown = math.inf if slowest.median_s > 0 else 1.0
    return StragglerReport(name, epoch, timings, slowest.rank, slowdown, threshold)


class StragglerMonitor:
    """Times each step on this rank and, at ``epoch_end()``, reports the slowest rank on every rank.

        monitor = StragglerMonitor(comm, threshold=1.2)
        for epoch in range(epochs):
            for batch in loader:
                with monitor.step():            # or step_begin() ... step_end()
                    train_step(batch)           # wait inside collectives: see add_wait()/waiting()
            report = monitor.epoch_end(epoch)   # collective; report.straggler is a rank or None

    Each step's time is its wall time minus the waits reported during it (see the module doc for
    why). ``name`` fixes the collective's name: give every rank the same one, and two monitors used
    in one job different ones. ``clock`` (seconds, monotonic) is injectable for tests.
    Env: HVDKIT_STRAGGLER_THRESHOLD (when ``threshold`` is None).
    """

    def __init__(
        self,
        comm: Communicator,
        threshold: float | None = None,
        name: str = "train",
        clock: Callable[[], float] = time.perf_counter,
        host: str | None = None,
    ) -> None:
        if not isinstance(name, str) or not name:
            raise ConfigError(f"name must be a non-empty string, the same on every rank (got {name!r})")
        self.comm = comm
        self.threshold = straggler_threshold(threshold)
        self.name = name
        self.host = socket.gethostname() if host is None else str(host)
        self.last_report = None
        self._clock = clock
        self._times = []
        self._begin = None
        self._wait = 0.0

    def step_begin(self) -> None:
        """Start timing a step (calling it again before ``step_end()`` restarts the step)."""
        self._begin = self._clock()
        self._wait = 0.0

    def step_end(self) -> float:
        """Stop timing the step; records and returns its time (wall time minus reported waits)."""
        if self._begin is None:
            raise ConfigError("step_end() was called without step_begin(); call step_begin() at the start of the step")
        elapsed = max(0.0, self._clock() - self._begin - self._wait)
        self._begin = None
        self.record(elapsed)
        return elapsed

    @contextmanager
    def step(self) -> Iterator[Self]:
        """Time the block as one step (not recorded when the block raises)."""
        self.step_begin()
        yield self
        self.step_end()

    def add_wait(self, seconds: float) -> None:
        """Exclude ``seconds`` spent waiting in a collective from the current step (ignored outside a step)."""
        if self._begin is not None:
            self._wait += float(seconds)

    @contextmanager
    def waiting(self) -> Iterator[None]:
        """Exclude the time spent in the block (a collective) from the current step."""
        start = self._clock()
        try:
            yield
        finally:
            self.add_wait(self._clock() - start)

    def record(self, seconds: float) -> None:
        """Record one step's time measured elsewhere, in seconds."""
        check_number_at_least("a step time", seconds, what="a finite number of seconds >= 0")
        self._times.append(float(seconds))

    def local_timing(self) -> RankTiming:
        """This rank's RankTiming for the steps recorded since the last ``epoch_end()``."""
        times = self._times
        if not times:
            return RankTiming(self.comm.rank, self.host, 0, math.nan, math.nan)
        return RankTiming(
            self.comm.rank, self.host, len(times), statistics.median(times), math.fsum(times) / len(times)
        )

    def epoch_end(self, epoch: int | None = None) -> StragglerReport:
        """Gather every rank's step times; return the StragglerReport (the same on every rank).

        Rank 0 logs it: a WARNING when a rank is above the threshold, INFO otherwise. The recorded
        steps are then cleared. Collective: every rank calls it, with the same monitor ``name``.
        """
        gathered = self.comm.allgather_object(asdict(self.local_timing()), name=f"hvdkit.straggler.{self.name}")
        report = build_report([RankTiming(**t) for t in gathered], self.threshold, self.name, epoch)
        self._times = []
        self.last_report = report
        if self.comm.rank == 0:
            _log.log(logging.WARNING if report.exceeded else logging.INFO, "%s", report.summary())
        return report
