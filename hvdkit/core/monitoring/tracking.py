"""Experiment tracking on rank 0: TensorBoard event files and MLflow runs of job-wide metrics.

    tracker = Tracker(comm, "runs/exp1", backends=("tensorboard", "mlflow"), params={"lr": 0.1})
    avg = average_metrics(totals, comm)          # collective: every rank
    tracker.log_metrics(avg, step=epoch)         # not collective: rank 0 writes, the others skip
    tracker.close()                              # or: with Tracker(...) as tracker:

Only rank 0 writes; other ranks check their inputs alike and do nothing else. Metrics must already
be averaged over ranks. The writers live in their own modules: ``tensorboard_events`` (event files
without TensorFlow, framed by ``tfrecord``) and ``mlflow_store`` (``MlflowClient``, never the fluent
global run); each imports its package at first use.
"""

from __future__ import annotations

import atexit
import math
import operator
import os
import sys
from collections.abc import Iterable, Mapping
from types import TracebackType
from typing import TYPE_CHECKING, Any, Literal, Self, SupportsIndex

from ..errors import ConfigError
from ..log import get_logger
from ..tune_channel import report_from
from .mlflow_store import MlflowRun, resolve_mlflow_uri
from .tensorboard_events import TensorBoardWriter
from .tfrecord import crc32c, masked_crc32c

if TYPE_CHECKING:
    from ..comm import Communicator
    from ..runtime import Runtime

__all__ = [
    "BACKENDS",
    "Tracker",
    "RuntimeTracker",
    "TensorBoardWriter",
    "MlflowRun",
    "crc32c",
    "masked_crc32c",
    "resolve_mlflow_uri",
]

BACKENDS = ("tensorboard", "mlflow")
_log = get_logger("tracking")


def _check_backends(backends):
    if isinstance(backends, str):
        backends = (backends,)
    for b in backends:
        if b not in BACKENDS:
            raise ConfigError(f"unknown tracking backend {b!r}; choose from {', '.join(BACKENDS)}")
    return tuple(dict.fromkeys(backends))


def _check_step(step):
    try:
        value = -1 if isinstance(step, bool) else operator.index(step)  # int, numpy or 0-d tensor integers
    except TypeError:
        value = -1
    if value < 0:
        raise ConfigError(f"step must be an integer >= 0 (got {step!r}); pass the epoch or batch number")
    return value


def _named_items(mapping, what, values, noun):
    """``mapping``'s items, each name checked: ConfigError unless a mapping with non-empty string names."""
    if not isinstance(mapping, Mapping):
        raise ConfigError(f"{what} must be a mapping of names to {values} (got {type(mapping).__name__})")
    for name, value in mapping.items():
        if not isinstance(name, str) or not name:
            raise ConfigError(f"{noun} names must be non-empty strings (got {name!r})")
        yield name, value


def _check_metrics(metrics, step):
    out = {}
    for name, value in _named_items(metrics, "metrics", "numbers", "metric"):
        try:
            if isinstance(value, (str, bytes)):
                raise TypeError
            number = float(value)
        except (TypeError, ValueError):
            raise ConfigError(
                f"metric {name!r} must be a number (got {type(value).__name__} {value!r:.60}); "
                "log a float, e.g. loss.item()"
            ) from None
        if not math.isfinite(number):
            raise ConfigError(
                f"metric {name!r} is {number} at step {step}; log finite values only "
                "(an average over no samples is nan: leave that metric out)"
            )
        out[name] = number
    return out


def _framework_versions():
    # Only frameworks the program already imported: cheap, and the core imports none itself.
    from ... import __version__

    versions = {"hvdkit_version": __version__}
    for mod in ("torch", "tensorflow", "keras", "horovod"):
        if mod in sys.modules:
            versions[f"{mod}_version"] = getattr(sys.modules[mod], "__version__", "unknown")
    return versions


class Tracker:
    """Logs parameters and job-wide metrics to TensorBoard and/or MLflow, from rank 0 only.

    ``comm`` gives ``rank`` and ``size``; ``log_dir`` holds the event file and the default MLflow
    SQLite store; ``backends``: any of ``"tensorboard"``, ``"mlflow"``; ``params``: hyperparameters,
    to which ``world_size`` and the versions of hvdkit and the frameworks already imported are added;
    ``mlflow_uri`` (see ``resolve_mlflow_uri``), ``experiment`` and ``run_name`` (default: the name
    of ``log_dir``) place the MLflow run. ``close`` ends it FINISHED, or FAILED when a ``with`` block
    raised or the process exits unclosed (e.g. ``fit`` raised).
    Collective: no. Every rank may call every method; it never communicates, so pass metrics
    already averaged over ranks. A write error on rank 0 ends rank 0; the launcher ends the job.
    Env: MLFLOW_TRACKING_URI; sets MLFLOW_ALLOW_FILE_STORE for a ``file:`` URI.
    """

    def __init__(
        self,
        comm: Communicator,
        log_dir: str | os.PathLike[str],
        backends: str | Iterable[str] = ("tensorboard",),
        params: Mapping[str, Any] | None = None,
        mlflow_uri: str | None = None,
        experiment: str = "hvdkit",
        run_name: str | None = None,
    ) -> None:
        self.backends = _check_backends(backends)
        self.log_dir = os.fspath(log_dir)
        self.rank, self.size = comm.rank, comm.size
        self.params = {}
        self.tensorboard = self.mlflow = None
        self.closed = False
        first = self._new_params({**(params or {}), "world_size": self.size, **_framework_versions()})
        if self.rank == 0:
            if "tensorboard" in self.backends:
                self.tensorboard = TensorBoardWriter(self.log_dir)
            if "mlflow" in self.backends:
                name = run_name or os.path.basename(os.path.abspath(self.log_dir))
                self.mlflow = MlflowRun(self.log_dir, mlflow_uri, experiment, name)
            atexit.register(self._close_at_exit)
            _log.info("tracking %s in %s", " and ".join(self.backends) or "nothing", self.log_dir)
        # Where rank 0 writes (None elsewhere, or without that backend).
        self.event_file = self.tensorboard.path if self.tensorboard else None
        self.mlflow_run_id = self.mlflow.run_id if self.mlflow else None
        self._record_params(first)

    def _check_open(self):
        if self.closed:
            raise ConfigError(f"this tracker of {self.log_dir!r} is closed; create a new Tracker to log again")

    def _new_params(self, params):
        """The entries of ``params`` not logged yet; ConfigError for a bad name or a changed value."""
        new = {}
        for k, v in _named_items(params, "params", "values", "parameter"):
            if k in self.params and str(self.params[k]) != str(v):
                raise ConfigError(
                    f"parameter {k!r} was logged as {self.params[k]!r}, now {v!r}; parameters cannot "
                    "change within a run: log the new value as a metric or under another name"
                )
            if k not in self.params:
                new[k] = v
        return new

    def _record_params(self, new):
        self.params.update(new)
        if new and self.tensorboard:
            self.tensorboard.add_params(new)
        if new and self.mlflow:
            self.mlflow.log_params(new)

    def log_params(self, params: Mapping[str, Any]) -> None:
        """Record hyperparameters; a name already logged must keep its value (MLflow params never change).

        Collective: no.
        """
        self._check_open()
        self._record_params(self._new_params(params))

    def log_metrics(self, metrics: Mapping[str, float], step: SupportsIndex) -> None:
        """Record ``{name: number}`` at ``step`` (an integer >= 0): values already averaged over ranks.

        Raises ConfigError on every rank for a non-numeric or non-finite value. Inside a trial of
        ``hvdkit tune``, rank 0 also reports them to it at ``step`` (as ``hvdkit.tune.report``). Collective: no.
        Env: HVDKIT_TUNE_REPORT (set by ``hvdkit tune``).
        """
        self._check_open()
        step = _check_step(step)
        values = _check_metrics(metrics, step)
        report_from(self.rank, step, values)  # to `hvdkit tune`'s trial, when inside one (rank 0 only)
        if self.tensorboard:
            self.tensorboard.add_scalars(values, step)
        if self.mlflow:
            self.mlflow.log_metrics(values, step)

    def close(self, failed: bool = False) -> None:
        """Finish the run (MLflow status FINISHED, or FAILED when ``failed``) and close the files.

        Idempotent. Collective: no.
        """
        if self.closed:
            return
        self.closed = True
        if self.rank == 0:
            atexit.unregister(self._close_at_exit)
        for backend in (self.tensorboard, self.mlflow):
            if backend is not None:
                backend.close(failed=failed)

    def _close_at_exit(self):
        _log.warning("tracker of %s was not closed: marking its run failed", self.log_dir)
        self.close(failed=True)

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> Literal[False]:
        self.close(failed=exc_type is not None)
        return False


class RuntimeTracker(Tracker):
    """A Tracker on the communicator of an adapter's Runtime (the subclass sets ``runtime``): what
    ``hvdkit.torch.Tracker`` and ``hvdkit.tensorflow.Tracker`` are. Collective: no."""

    runtime: Runtime | None = None  # the adapter's hvdkit.core.runtime.Runtime

    def __init__(
        self,
        log_dir: str | os.PathLike[str],
        backends: str | Iterable[str] = ("tensorboard",),
        params: Mapping[str, Any] | None = None,
        mlflow_uri: str | None = None,
        experiment: str = "hvdkit",
        run_name: str | None = None,
    ) -> None:
        super().__init__(
            self.runtime.communicator(),
            log_dir,
            backends=backends,
            params=params,
            mlflow_uri=mlflow_uri,
            experiment=experiment,
            run_name=run_name,
        )
