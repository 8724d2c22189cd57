"""MLflow runs driven through ``MlflowClient``, so a user's own fluent ``mlflow.start_run`` is left alone.

MLflow is imported when a run is made; the default store is a SQLite file in the log folder.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Mapping
from types import SimpleNamespace
from typing import Any
from urllib.parse import urlparse

from .. import env as _env
from ..errors import MissingDependencyError

__all__ = ["MlflowRun", "resolve_mlflow_uri"]

_INSTALL = "run `make setup`, or `pip install tensorboard mlflow-skinny sqlalchemy alembic`"


def _mlflow():
    """MLflow's client and entities, imported now; MissingDependencyError saying how to get them."""
    try:
        from mlflow.entities import Metric, Param
        from mlflow.tracking import MlflowClient
    except ImportError as e:
        raise MissingDependencyError(f"the mlflow tracking backend needs {e.name or 'mlflow'}; {_INSTALL}") from e
    return SimpleNamespace(client=MlflowClient, metric=Metric, param=Param)


@contextlib.contextmanager
def _quiet(*names):
    """Raise some loggers to WARNING for a while (MLflow logs INFO lines while creating its tables)."""
    saved = [(lg, lg.level) for lg in map(logging.getLogger, names)]
    for lg, _ in saved:
        lg.setLevel(max(lg.getEffectiveLevel(), logging.WARNING))
    try:
        yield
    finally:
        for lg, level in saved:
            lg.setLevel(level)


def resolve_mlflow_uri(
    log_dir: str | os.PathLike[str], uri: str | None = None, environ: Mapping[str, str] | None = None
) -> str:
    """The MLflow tracking URI: ``uri``, else MLFLOW_TRACKING_URI, else ``sqlite:///<log_dir>/mlflow.db``.

    MLflow 3 refuses its old file store (``file:`` URIs, plain paths) unless
    MLFLOW_ALLOW_FILE_STORE is true; ``MlflowRun`` sets it for such a URI when it is unset.
    Env: MLFLOW_TRACKING_URI.
    """
    environ = os.environ if environ is None else environ
    uri = uri or environ.get(_env.MLFLOW_TRACKING_URI)
    return uri or f"sqlite:///{os.path.abspath(os.path.join(log_dir, 'mlflow.db'))}"


class MlflowRun:
    """One MLflow run through ``MlflowClient`` (the fluent ``mlflow.active_run`` stays untouched).

    The default store is a SQLite file in ``log_dir`` (no server); artifacts of experiments created
    here go to ``<log_dir>/mlartifacts``. Rank 0's job; no collective.
    Env: MLFLOW_TRACKING_URI (read); MLFLOW_ALLOW_FILE_STORE (set to true for a ``file:`` URI).
    """

    def __init__(
        self,
        log_dir: str | os.PathLike[str],
        uri: str | None = None,
        experiment: str = "hvdkit",
        run_name: str | None = None,
    ) -> None:
        self._ml = _mlflow()
        self.uri = resolve_mlflow_uri(log_dir, uri)
        if urlparse(self.uri).scheme in ("", "file"):
            os.environ.setdefault(_env.MLFLOW_ALLOW_FILE_STORE, "true")
        if self.uri.startswith("sqlite:///"):
            os.makedirs(os.path.dirname(self.uri[len("sqlite:///") :]) or ".", exist_ok=True)
        try:
            with _quiet("mlflow", "alembic"):  # the store (and SQLite's tables) is made on first use
                self._client = self._ml.client(tracking_uri=self.uri)
                exp = self._client.get_experiment_by_name(experiment)
                if exp is None:
                    artifacts = os.path.abspath(os.path.join(log_dir, "mlartifacts"))
                    exp_id = self._client.create_experiment(experiment, artifact_location=artifacts)
                else:
                    exp_id = exp.experiment_id
                self.run_id = self._client.create_run(exp_id, run_name=run_name).info.run_id
        except ImportError as e:  # sqlalchemy or alembic, imported by the SQL store
            raise MissingDependencyError(f"the MLflow store {self.uri!r} needs {e.name}; {_INSTALL}") from e

    def log_params(self, params: Mapping[str, Any]) -> None:
        """Record parameters (MLflow keeps them as strings and never changes them)."""
        self._client.log_batch(self.run_id, params=[self._ml.param(k, str(v)) for k, v in params.items()])

    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None:
        now = int(time.time() * 1000)
        self._client.log_batch(self.run_id, metrics=[self._ml.metric(k, v, now, step) for k, v in metrics.items()])

    def close(self, failed: bool = False) -> None:
        self._client.set_terminated(self.run_id, "FAILED" if failed else "FINISHED")
