"""Timing arithmetic shared by the benchmark workers: medians, spread, bandwidth, interleaving.

Framework-free. Every figure the suite publishes is a ratio of two medians taken in the same run,
with the variants of one comparison interleaved (A B C A B C ...), so a slow spell on a shared
machine hits every variant alike instead of one.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypeVar

T = TypeVar("T")

__all__ = [
    "Samples",
    "bus_bandwidth",
    "ring_bytes_sent",
    "interleaved",
    "iterations_for",
    "ratio",
    "check_close",
    "BenchmarkCheckError",
]


class BenchmarkCheckError(AssertionError):
    """A benchmark variant computed a wrong result, so its timing would mean nothing."""


class Samples:
    """Repeated timings of one variant (seconds per operation): median and spread."""

    def __init__(self, values: Iterable[float] = ()) -> None:
        self.values = [float(v) for v in values]

    def add(self, seconds: float) -> None:
        self.values.append(float(seconds))

    @property
    def median(self) -> float:
        return statistics.median(self.values) if self.values else math.nan

    @property
    def spread(self) -> float:
        """(max - min) / median: how far apart the repetitions were (0.05 = 5 %)."""
        if len(self.values) < 2 or not self.median:
            return 0.0
        return (max(self.values) - min(self.values)) / self.median

    def as_dict(self) -> dict[str, Any]:
        return {"median_s": self.median, "spread": self.spread, "samples_s": self.values}


def ratio(a: Samples, b: Samples) -> float:
    """median(a) / median(b), NaN when b has no time."""
    return a.median / b.median if b.median else math.nan


def bus_bandwidth(nbytes: float, seconds: float, size: int) -> float:
    """Allreduce bus bandwidth in bytes/s: algorithm bandwidth x 2(N-1)/N.

    A ring allreduce moves 2(N-1)/N of the buffer through each rank's link, so bus bandwidth is
    comparable across rank counts and with the link's (here: memory's) own bandwidth.
    """
    if seconds <= 0:
        return math.nan
    return nbytes / seconds * (2 * (size - 1) / size)


RING_COLLECTIVES = ("allreduce", "reducescatter", "allgather")


def ring_bytes_sent(collective: str, nbytes: float, size: int) -> float:
    """Bytes one rank sends in a ring ``collective`` over a buffer of ``nbytes`` (the whole vector) on ``size`` ranks.

    A ring reduce-scatter and a ring all-gather each pass ``size - 1`` chunks of ``nbytes / size``
    through every rank's link: ``(N-1)/N * nbytes``; an allreduce is the two in sequence,
    ``2 (N-1)/N * nbytes``. So ZeRO-1 (reduce-scatter of the gradients, all-gather of the
    parameters) sends what one allreduce of the gradients does.
    """
    if collective not in RING_COLLECTIVES:
        raise ValueError(f"collective must be one of {RING_COLLECTIVES} (got {collective!r})")
    if not (isinstance(size, int) and size >= 1):
        raise ValueError(f"size must be an integer >= 1 (got {size!r})")
    if not nbytes >= 0:
        raise ValueError(f"nbytes must be >= 0 (got {nbytes!r})")
    passes = 2 if collective == "allreduce" else 1
    return passes * (size - 1) / size * nbytes


def iterations_for(nbytes: int, budget_bytes: int = 32 << 20, lo: int = 2, hi: int = 100) -> int:
    """How many operations to time back to back for a buffer of ``nbytes``: equal on every rank.

    Small buffers repeat more (one op is too short to time); the count depends on the size alone,
    never on a rank's own measurement, so every rank runs the same number of collectives.
    """
    return int(min(hi, max(lo, budget_bytes // max(1, nbytes))))


def interleaved(variants: Sequence[T], reps: int) -> list[tuple[int, T]]:
    """[(rep, variant), ...] in the order A B C A B C ...: each rep visits every variant once."""
    return [(rep, v) for rep in range(reps) for v in variants]


def timed(fn: Callable[[], object], iters: int, clock: Callable[[], float] = time.perf_counter) -> float:
    """Seconds per call of ``fn`` over ``iters`` back-to-back calls."""
    t0 = clock()
    for _ in range(iters):
        fn()
    return (clock() - t0) / iters


def check_close(what: str, got: Sequence[float], expected: Sequence[float], tol: float) -> float:
    """Raise BenchmarkCheckError naming ``what`` unless every |got - expected| <= tol."""
    # strict=False: a length mismatch is reported below, naming ``what``, not as zip's ValueError
    worst = max((abs(float(g) - float(e)) for g, e in zip(got, expected, strict=False)), default=0.0)
    if len(got) != len(expected) or not worst <= tol:
        raise BenchmarkCheckError(
            f"{what}: result is wrong (max |diff| {worst:.3g} > {tol:g}, {len(got)} values vs {len(expected)}); "
            "its timing is not reported"
        )
    return worst
