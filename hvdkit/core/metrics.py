"""Exact metric averaging across ranks.

A metric is a mean over samples. Each rank keeps, per metric, the *sum* of its per-sample values and
the *count* of samples; the job-wide value is sum(sums) / sum(counts), which is the metric over the
union of every rank's samples, also when shards are uneven. (Horovod's MetricAverageCallback takes
the unweighted mean of per-rank means, which is wrong as soon as shards differ in size.)
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING

from .errors import CollectiveError, ConfigError

if TYPE_CHECKING:
    from .comm import Communicator

__all__ = ["MetricTracker", "average_metrics", "sum_states"]


def _names_fingerprint(names):
    # A small integer per name list: exactly representable, and its square too, in float64 sums.
    return float(zlib.crc32("\0".join(names).encode()) % (1 << 20))


def sum_states(
    states: Mapping[str, Sequence[float]], comm: Communicator, name: str = "hvdkit.metrics"
) -> dict[str, list[float]]:
    """Element-wise sums over all ranks of ``{key: [numbers]}``, in one allreduce.

    The sums of additive metric states (sums and counts, confusion counts) give the metric over the
    union of every rank's samples. A fingerprint of the keys and lengths travels with the values,
    so ranks whose states differ get a CollectiveError on every rank instead of wrong numbers.

    Collective: every rank calls it with the same keys and lengths (in any order).
    """
    keys = sorted(states)
    values, layout = [], []
    for key in keys:
        vec = [float(v) for v in states[key]]
        values += vec
        layout.append(f"{key}:{len(vec)}")
    fp = _names_fingerprint(layout)
    reduced = comm.allreduce_sum(values + [fp, fp * fp], name=name)
    fp_sum, fp_sq = reduced[-2], reduced[-1]
    # sum(x)^2 == n * sum(x^2) holds only when every rank's fingerprint is the same.
    if fp_sum * fp_sum != comm.size * fp_sq:
        raise CollectiveError(
            f"ranks track different metrics (rank {comm.rank} has {keys}); "
            "update the same metric names on every rank, also on ranks with no samples (count 0)"
        )
    out, i = {}, 0
    for key in keys:
        n = len(states[key])
        out[key] = reduced[i : i + n]
        i += n
    return out


def average_metrics(
    totals: Mapping[str, tuple[float, float]] | MetricTracker, comm: Communicator, name: str = "hvdkit.metrics"
) -> dict[str, float]:
    """Sample-weighted averages over all ranks from per-rank ``{metric: (sum, count)}`` (or a MetricTracker).

    Returns ``{metric: sum over ranks of sums / sum over ranks of counts}`` (NaN where no rank saw a
    sample): the metric over the union of all ranks' samples, also with uneven shards.

    Collective: every rank calls it with the same metric names (in any order).
    """
    if isinstance(totals, MetricTracker):
        totals = totals.local()
    for key, (_, count) in totals.items():
        if count < 0:
            raise ConfigError(f"metric {key!r} has a negative sample count ({count}); counts are numbers of samples")
    summed = sum_states({k: (float(t), float(c)) for k, (t, c) in totals.items()}, comm, name=name)
    return {k: (t / c if c > 0 else math.nan) for k, (t, c) in summed.items()}


class MetricTracker:
    """Accumulates per-sample metrics on one rank; ``compute`` averages them over all ranks.

    >>> t = MetricTracker(["loss", "accuracy"])
    >>> t.update("loss", batch_mean_loss, count=len(batch))   # mean over the batch's samples
    >>> t.update("accuracy", correct / len(batch), count=len(batch))
    >>> t.compute(comm)                                        # collective
    """

    def __init__(self, names: Iterable[str] = ()) -> None:
        self._totals = {n: [0.0, 0] for n in names}

    def update(self, name: str, mean: float, count: int = 1) -> None:
        """Add ``count`` samples whose mean value is ``mean``."""
        self.update_sum(name, float(mean) * count, count)

    def update_sum(self, name: str, total: float, count: int) -> None:
        """Add ``count`` samples whose values sum to ``total``."""
        if count < 0:
            raise ConfigError(f"count must be >= 0 (got {count}) for metric {name!r}")
        acc = self._totals.setdefault(name, [0.0, 0])
        acc[0] += float(total)
        acc[1] += count

    def local(self) -> dict[str, tuple[float, int]]:
        """This rank's ``{metric: (sum, count)}``."""
        return {k: (v[0], v[1]) for k, v in self._totals.items()}

    def compute(self, comm: Communicator, name: str = "hvdkit.metrics") -> dict[str, float]:
        """Job-wide sample-weighted means. Collective (see ``average_metrics``)."""
        return average_metrics(self.local(), comm, name=name)

    def reset(self) -> None:
        for acc in self._totals.values():
            acc[0], acc[1] = 0.0, 0
