"""The metric state of the epoch in progress, which ``hk.elastic.fit`` commits and restores so that an epoch cut by
a recovery or a stop logs the metrics of the whole epoch, as an uninterrupted run does.

Keras 3 keeps every metric's state in variables that add up over batches and over ranks: a ``Mean`` (the compiled
loss tracker, ``accuracy``) keeps a weighted total and a count, ``Precision`` and ``AUC`` confusion counts, and
``fit`` resets them at the start of every epoch. A commit holds every rank's state (``gather``: one allreduce);
after a recovery or a resume, at the first batch of the rest of the epoch (when Keras has reset and built the
metrics), each rank adds its share (``share``: at the same world size its own state, at another the sum of the
old ranks' states it stands for), so the job-wide sum of the states, which ``MetricAverageCallback`` averages,
is that of the whole epoch. Metrics whose state does not add up over samples are not exact here, as in
``MetricAverageCallback``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import keras
import numpy as np

from ...core.comm import Communicator
from ...core.errors import ConfigError
from ...core.log import get_logger
from ...core.metrics import sum_states

__all__ = ["check", "gather", "layout", "local_state", "restore", "share"]

_log = get_logger("elastic")


def _variables(model):
    return [v for m in model.metrics for v in m.variables]


def layout(model: keras.Model) -> list[str]:
    """Every metric variable of ``model`` as ``path[shape]``, in the order of ``local_state``."""
    return [f"{getattr(v, 'path', v.name)}{list(v.shape)}" for v in _variables(model)]


def local_state(model: keras.Model) -> list[float]:
    """This rank's metric variables, flattened in ``layout``'s order (float64: a float32 value exactly)."""
    parts = [np.ravel(np.asarray(v.numpy(), dtype=np.float64)) for v in _variables(model)]
    return np.concatenate(parts).tolist() if parts else []


def gather(model: keras.Model, comm: Communicator) -> dict[str, Any]:
    """Every rank's metric state: ``{"layout": [...], "ranks": [rank 0's state, rank 1's, ...]}`` (plain lists,
    for a commit and a checkpoint's ``extra``). One allreduce in which each rank fills its own slot (sums with
    zeros: exact). Collective: every rank calls it, with the same metrics (else CollectiveError on every rank)."""
    names, mine = layout(model), local_state(model)
    k, rank = len(mine), comm.rank
    values = [0.0] * (k * comm.size)
    values[rank * k : (rank + 1) * k] = mine
    key = "metrics:" + ";".join(names)  # its fingerprint tells ranks with other metrics apart
    summed = sum_states({key: values}, comm, name="hvdkit.keras.elastic.metrics")[key]
    return {"layout": names, "ranks": [summed[r * k : (r + 1) * k] for r in range(comm.size)]}


def check(committed: Any, where: str) -> dict[str, Any] | None:
    """``committed`` (``gather``'s form, or None) checked; ConfigError naming ``where`` when it is not that form."""
    if committed is None:
        return None
    ok = isinstance(committed, Mapping) and isinstance(committed.get("layout"), list)
    ranks = committed.get("ranks") if ok else None
    ok = ok and isinstance(ranks, list) and len(ranks) > 0
    ok = ok and all(isinstance(r, list) and len(r) == len(ranks[0]) for r in ranks)
    ok = ok and all(isinstance(x, (int, float)) and not isinstance(x, bool) for r in ranks for x in r)
    if not ok:
        raise ConfigError(
            f"{where} holds metrics that are not a metric state of hk.elastic.fit "
            "({'layout': [names], 'ranks': [[numbers] per rank]}); point the checkpoint directory at checkpoints "
            "hk.elastic.fit wrote, or at an empty directory"
        )
    return {"layout": list(committed["layout"]), "ranks": [[float(x) for x in r] for r in ranks]}


def share(committed: Mapping[str, Any], size: int, rank: int) -> list[float]:
    """The part of ``committed`` (``gather``'s) that ``rank`` of ``size`` ranks restores: the sum of the states of
    the committed ranks ``i`` with ``i % size == rank``. At the committed size that is the rank's own state (the same
    numbers: the rest of the epoch then adds up as without the cut); at another size the job-wide sum is kept
    (2 ranks to 1: the sum; 1 to 2: rank 0 the state, rank 1 zeros). Pure."""
    ranks = committed["ranks"]
    out = [0.0] * len(ranks[0])
    for i in range(rank, len(ranks), size):
        out = [a + b for a, b in zip(out, ranks[i], strict=True)]
    return out


def restore(model: keras.Model, committed: Mapping[str, Any] | None, size: int, rank: int) -> bool:
    """Add ``rank``'s ``share`` of ``committed`` into ``model``'s metric variables: after the first batch of the rest
    of an epoch (Keras has reset the metrics at the epoch's start and built them in its first train step). Addition
    is commutative, so at the committed size the variables hold the same numbers as without the cut. False (nothing
    added) when there is nothing committed, or when the metrics are not those committed (rank 0 warns). No
    collective."""
    if committed is None:
        return False
    names = layout(model)
    if names != list(committed["layout"]):
        if rank == 0:
            _log.warning(
                "the committed metric state is of other metrics (%s) than the model's (%s): this epoch's logged "
                "metrics cover the batches since the resume only",
                committed["layout"],
                names,
            )
        return False
    part, i = share(committed, size, rank), 0
    for v in _variables(model):
        n = math.prod(v.shape)
        add = np.reshape(np.asarray(part[i : i + n]), tuple(v.shape)).astype(v.dtype)
        v.assign(np.asarray(v.numpy()) + add)
        i += n
    return True
