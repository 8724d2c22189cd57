"""The channel from a trial's rank 0 to ``hvdkit tune``: one JSON line per report, appended to a file.

``hvdkit.tune.report`` (the user's call), the torch Trainer and the Tracker write through ``report_from``;
``hvdkit tune`` reads with ``read_reports``.

``hvdkit tune`` sets HVDKIT_TUNE_REPORT for each trial's ``hvdkit run`` (which passes every
``HVDKIT_*`` variable to its ranks); rank 0 appends ``{"epoch": E, "metrics": {...}}`` lines to that
file with one ``write`` each, and ``hvdkit tune`` reads the complete lines as they come. Framework-free
and cheap: the standard library only.
"""

from __future__ import annotations

import json
import math
import numbers
import os
from collections.abc import Mapping
from typing import Any

from . import env as _env
from .errors import ConfigError

__all__ = ["report_from", "read_reports"]


def report_from(rank: int, epoch: int, metrics: Mapping[str, Any]) -> None:
    """``report`` for a caller that knows its rank (the Trainer, a Tracker): writes only on rank 0,
    only inside a trial. Collective: no. Env: HVDKIT_TUNE_REPORT."""
    path = os.environ.get(_env.TUNE_REPORT)
    if not path or rank != 0:
        return
    record = {"epoch": _check_epoch(epoch), "metrics": _check_metrics(metrics)}
    line = (json.dumps(record, allow_nan=True) + "\n").encode()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:  # one write of a whole line: the reader never sees half of it once the line ends
        os.write(fd, line)
    finally:
        os.close(fd)


def _check_epoch(epoch):
    if isinstance(epoch, bool) or not isinstance(epoch, numbers.Integral) or epoch < 0:
        raise ConfigError(
            f"hvdkit.tune.report: epoch must be an integer >= 0 (got {epoch!r}), e.g. report(0, loss=1.2)"
        )
    return int(epoch)


def _check_metrics(metrics):
    out = {}
    for name, value in metrics.items():
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            try:  # a 0-d tensor or numpy scalar has __float__
                value = float(value)
            except (TypeError, ValueError):
                raise ConfigError(
                    f"hvdkit.tune.report: metric {name!r} must be a number (got {value!r}); pass float(value)"
                ) from None
        out[str(name)] = float(value)
    return out


def read_reports(path: str, offset: int = 0) -> tuple[list[dict[str, Any]], int]:
    """``(records, new offset)``: the complete lines of the report file ``path`` from byte ``offset``.

    A missing file has no records yet; a line not ended yet is left for the next call; a line that is
    not a report (not JSON) is skipped.
    """
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            data = f.read()
    except FileNotFoundError:
        return [], offset
    end = data.rfind(b"\n") + 1
    records = []
    for raw in data[:end].splitlines():
        try:
            record = json.loads(raw)
        except ValueError:
            continue
        if (
            isinstance(record, dict)
            and isinstance(record.get("epoch"), int)
            and isinstance(record.get("metrics"), dict)
        ):
            records.append(record)
    return records, offset + end


def is_finite(value: float) -> bool:
    """True for a real number that is neither NaN nor infinite."""
    return isinstance(value, (int, float)) and math.isfinite(value)
