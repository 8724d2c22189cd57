"""``hvdkit.tune.report``: a training script's per-epoch metrics, to the trial of ``hvdkit tune`` it runs in.

The channel itself (a file of JSON lines; see ``hvdkit.core.tune_channel``) is framework-free and
cheap, so calling ``report`` costs one environment lookup outside a trial.
"""

from __future__ import annotations

import os

from ..core import env as _env
from ..core.topology import from_env
from ..core.tune_channel import report_from

__all__ = ["report"]


def report(epoch: int, **metrics: float) -> None:
    """Tell ``hvdkit tune`` this trial's metrics after ``epoch`` (an integer >= 0, e.g. 0-based epochs).

        hvdkit.tune.report(epoch, val_loss=0.31, val_accuracy=0.92)

    Only rank 0's values count (other ranks return at once); pass values already averaged over the
    ranks. Outside a trial of ``hvdkit tune`` it does nothing. Reporting the same epoch again adds
    to (and overrides) that epoch's metrics. A value that is not a real number is a ConfigError.
    Collective: no.
    Env: HVDKIT_TUNE_REPORT (set by ``hvdkit tune``); the rank from the launcher's variables.
    """
    if not os.environ.get(_env.TUNE_REPORT):
        return
    report_from(from_env().rank, epoch, metrics)
