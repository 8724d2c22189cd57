"""How a trial's attempt ended, decided once for both backends: ``trial_outcome``.

From what the attempt left - its ``hvdkit run`` exit code, the epochs it reported, whether the
pruner stopped it, whether ``hvdkit tune`` itself was interrupted - to COMPLETE, PRUNED or FAIL and
why. The local driver (``study.py``) tells Optuna the outcome and retries a failed attempt; the
Ray backend (``ray_trial.py``) raises a failed attempt's reason to Ray. Pure: reads no file (the
caller passes the end of the attempt's log), imports no Optuna and no Ray.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

__all__ = [
    "Outcome",
    "trial_outcome",
    "COMPLETE",
    "PRUNED",
    "FAIL",
    "INTERRUPTED",
    "DIVERGED",
    "NO_METRIC",
    "EXITED",
]

COMPLETE, PRUNED, FAIL = "COMPLETE", "PRUNED", "FAIL"  # Optuna's names of the trial states

# Why an attempt FAILed, which says what comes next:
INTERRUPTED = "interrupted"  # hvdkit tune got a signal: rerun the same attempt later, not counted
DIVERGED = "diverged"  # the metric was NaN or infinite: an outcome of the parameters, not retried
NO_METRIC = "no metric"  # exited 0 without reporting the metric: a failed attempt, counted and retried
EXITED = "exit code"  # a nonzero exit: a failed attempt, counted and retried


@dataclass(frozen=True)
class Outcome:
    """How an attempt ended: ``state`` (COMPLETE, PRUNED or FAIL), ``value`` (the metric at its last
    reported epoch, None if never), and for FAIL its ``cause`` (INTERRUPTED, DIVERGED, NO_METRIC or
    EXITED) and ``why`` (a sentence; a nonzero exit adds the end of the log on the next lines)."""

    state: str
    value: float | None = None
    cause: str = ""
    why: str = ""

    @property
    def failed_attempt(self) -> bool:
        """True for a failure of the script or its environment (NO_METRIC, EXITED): it counts towards
        ``--max-failures`` and its parameters are retried up to ``--retries`` times."""
        return self.cause in (NO_METRIC, EXITED)


def last_value(epochs: Mapping[int, Mapping[str, float]], metric: str) -> float | None:
    """``metric`` at the last epoch of ``epochs`` (epoch -> {name: value}) that reported it; None if none did."""
    with_metric = [e for e, m in epochs.items() if metric in m]
    return float(epochs[max(with_metric)][metric]) if with_metric else None


def trial_outcome(
    code: int,
    epochs: Mapping[int, Mapping[str, float]],
    metric: str,
    *,
    pruned_at: int | None = None,
    interrupted: str | None = None,
    output: str = "",
    log: str = "",
) -> Outcome:
    """How an attempt that exited with ``code`` ended, after reporting ``epochs`` (epoch -> {name: value}).

    In this order: stopped by the pruner (``pruned_at``: the epoch) -> PRUNED; exit 0 with a finite
    last ``metric`` -> COMPLETE; ``hvdkit tune`` interrupted by the signal named ``interrupted`` ->
    FAIL (INTERRUPTED); exit 0 with a NaN or infinite metric -> FAIL (DIVERGED); exit 0 without the
    metric -> FAIL (NO_METRIC, naming what was reported); else -> FAIL (EXITED) with ``output``, the
    end of its log (``log``: the log's path, named when given). A stopped ``hvdkit run`` exits 143,
    not 0, so an attempt ended by a stop is never COMPLETE.
    """
    value = last_value(epochs, metric)
    if pruned_at is not None:
        return Outcome(PRUNED, value)
    if code == 0 and value is not None and math.isfinite(value):
        return Outcome(COMPLETE, value)
    if interrupted is not None:
        return Outcome(FAIL, value, INTERRUPTED, f"interrupted by {interrupted} sent to hvdkit tune")
    if code == 0 and value is not None:
        return Outcome(FAIL, value, DIVERGED, f"{metric} was {value} (diverged)")
    if code == 0:
        seen = sorted({k for m in epochs.values() for k in m})
        why = (
            f"exited 0 without reporting {metric!r} (reported: {', '.join(seen) or 'nothing'}); "
            f"call hvdkit.tune.report(epoch, {metric}=...) or use hvdkit's Trainer"
        )
        return Outcome(FAIL, value, NO_METRIC, why)
    where = f" ({log})" if log else ""
    return Outcome(FAIL, value, EXITED, f"exit code {code}; last output{where}:\n{output}")
