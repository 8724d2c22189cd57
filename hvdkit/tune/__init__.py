"""Hyperparameter search whose trials are distributed jobs: ``hvdkit tune`` and ``report``.

A training script tells its trial how it is doing with ``hvdkit.tune.report(epoch, val_loss=...)``
(a no-op outside ``hvdkit tune``); hvdkit's Trainer, ``Tracker`` and Keras ``TrackMetricsCallback``
report by themselves. Importing this package is cheap: the study engine (Optuna) is imported only
by ``hvdkit tune`` itself (``hvdkit.tune.study``).
"""

from __future__ import annotations

from .report import report
from .space import Param, SearchSpace, load_space, parse_space

__all__ = ["report", "Param", "SearchSpace", "load_space", "parse_space"]
