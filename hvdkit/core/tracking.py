"""Experiment tracking on rank 0: TensorBoard event files and MLflow runs of job-wide metrics.

    tracker = Tracker(comm, "runs/exp1", backends=("tensorboard", "mlflow"), params={"lr": 0.1})
    avg = average_metrics(totals, comm)          # collective: every rank
    tracker.log_metrics(avg, step=epoch)         # not collective: rank 0 writes, the others skip
    tracker.close()                              # or: with Tracker(...) as tracker:

Only rank 0 writes; other ranks check their inputs alike and do nothing else. Metrics must already
be averaged over ranks. The event-file writer is ours: TensorBoard's imports TensorFlow on its first
write (seconds and hundreds of MB in a torch job); only ``tensorboard``'s protobuf classes are used.
MLflow is driven through ``MlflowClient``, never the fluent global run, so a user's own
``mlflow.start_run`` is left alone. Both are imported at first use.
"""

import atexit
import contextlib
import logging
import math
import operator
import os
import socket
import struct
import sys
import time
from collections.abc import Mapping
from types import SimpleNamespace
from urllib.parse import urlparse

from . import env as _env
from .errors import ConfigError, MissingDependencyError
from .log import get_logger

__all__ = ["BACKENDS", "Tracker", "TensorBoardWriter", "MlflowRun", "crc32c", "masked_crc32c",
           "resolve_mlflow_uri", "tracker_for"]

BACKENDS = ("tensorboard", "mlflow")
_INSTALL = "run `make setup`, or `pip install tensorboard mlflow-skinny sqlalchemy alembic`"
_log = get_logger("tracking")


def _make_crc32c_table(poly=0x82F63B78):  # Castagnoli, bit-reflected
    def entry(crc):
        for _ in range(8):
            crc = (crc >> 1) ^ poly if crc & 1 else crc >> 1
        return crc

    return tuple(entry(byte) for byte in range(256))


_CRC32C_TABLE = _make_crc32c_table()


def crc32c(data, crc=0):
    """CRC-32C (Castagnoli) of ``data``, continuing from ``crc``; ``crc32c(b"123456789") == 0xE3069283``."""
    crc ^= 0xFFFFFFFF
    table = _CRC32C_TABLE
    for byte in bytes(data):
        crc = table[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def masked_crc32c(data):
    """The masked CRC-32C that TFRecord framing stores (a CRC of data holding CRCs stays useful)."""
    crc = crc32c(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def _record(data):
    """One TFRecord: length, masked CRC of the length, the data, masked CRC of the data."""
    header = struct.pack("<Q", len(data))
    return header + struct.pack("<I", masked_crc32c(header)) + data + struct.pack("<I", masked_crc32c(data))


def _import(what):
    """The modules a backend needs, imported now; MissingDependencyError saying how to get them."""
    try:
        if what == "tensorboard":
            from tensorboard.compat.proto import event_pb2, summary_pb2, tensor_pb2, tensor_shape_pb2, types_pb2
            from tensorboard.plugins.hparams import plugin_data_pb2

            return SimpleNamespace(event=event_pb2, summary=summary_pb2, tensor=tensor_pb2, shape=tensor_shape_pb2,
                                   types=types_pb2, hparams=plugin_data_pb2)
        from mlflow.entities import Metric, Param
        from mlflow.tracking import MlflowClient

        return SimpleNamespace(client=MlflowClient, metric=Metric, param=Param)
    except ImportError as e:
        raise MissingDependencyError(f"the {what} tracking backend needs {e.name or what}; {_INSTALL}") from e


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


def _cell(value):
    return str(value).replace("|", "\\|").replace("\n", " ")


def _markdown_table(params):
    rows = [f"| {_cell(k)} | {_cell(v)} |" for k, v in sorted(params.items())]
    return "\n".join(["| parameter | value |", "|---|---|", *rows])


class TensorBoardWriter:
    """Writes one TensorBoard event file: scalars as ``simple_value``, parameters as text and hparams.

    Parameters go in at the first ``add_scalars`` or at ``close`` (TensorBoard's hparams plugin
    reads one session start per run): a Markdown table under the tag ``params`` and the hparams
    plugin's session start, so runs can be compared in its table. Rank 0's job; no collective.
    """

    def __init__(self, log_dir):
        self._pb = _import("tensorboard")
        os.makedirs(log_dir, exist_ok=True)
        name = f"events.out.tfevents.{int(time.time()):010d}.{socket.gethostname()}.{os.getpid()}.hvdkit"
        self.path = os.path.join(log_dir, name)
        self._file = open(self.path, "wb")  # noqa: SIM115 - open until close()
        self._params, self._params_dirty, self._session_started = {}, False, False
        self._write_event(file_version="brain.Event:2")
        self._file.flush()

    def _write_event(self, **fields):
        self._file.write(_record(self._pb.event.Event(wall_time=time.time(), **fields).SerializeToString()))

    def _write(self, step, values):
        self._write_event(step=step, summary=self._pb.summary.Summary(value=values))

    def _plugin_value(self, tag, plugin, content, tensor):
        pb = self._pb.summary
        meta = pb.SummaryMetadata(plugin_data=pb.SummaryMetadata.PluginData(plugin_name=plugin, content=content))
        return pb.Summary.Value(tag=tag, metadata=meta, tensor=tensor)

    def _hparams_value(self, tag, **fields):
        pb = self._pb
        empty = pb.shape.TensorShapeProto(dim=[pb.shape.TensorShapeProto.Dim(size=0)])  # TensorBoard's null tensor
        content = pb.hparams.HParamsPluginData(version=0, **fields).SerializeToString()
        return self._plugin_value(tag, "hparams", content, pb.tensor.TensorProto(dtype=pb.types.DT_FLOAT, tensor_shape=empty))

    def add_params(self, params):
        """Remember parameters; they are written with the next scalars (or at ``close``)."""
        self._params.update(params)
        self._params_dirty = True

    def _flush_params(self, step):
        if not self._params_dirty:
            return
        pb = self._pb
        text = pb.tensor.TensorProto(dtype=pb.types.DT_STRING, string_val=[_markdown_table(self._params).encode()])
        values = [self._plugin_value("params", "text", b"", text)]
        if not self._session_started:
            start = pb.hparams.SessionStartInfo(start_time_secs=time.time())
            for k, v in self._params.items():
                if isinstance(v, bool):
                    start.hparams[k].bool_value = v
                elif isinstance(v, (int, float)) and math.isfinite(v):
                    start.hparams[k].number_value = v
                else:
                    start.hparams[k].string_value = str(v)
            values.append(self._hparams_value("_hparams_/session_start_info", session_start_info=start))
            self._session_started = True
        self._write(step, values)
        self._params_dirty = False

    def add_scalars(self, scalars, step):
        """Write ``{tag: float}`` at ``step`` (float32 in the file, as TensorBoard stores scalars)."""
        self._flush_params(step)
        self._write(step, [self._pb.summary.Summary.Value(tag=k, simple_value=v) for k, v in scalars.items()])
        self._file.flush()

    def close(self, failed=False):
        """Write pending parameters and the session's end (success or failure), then close the file."""
        if self._file.closed:
            return
        self._flush_params(0)
        if self._session_started:
            status = 2 if failed else 1  # tensorboard.hparams.Status: STATUS_FAILURE, STATUS_SUCCESS
            end = self._pb.hparams.SessionEndInfo(status=status, end_time_secs=time.time())
            self._write(0, [self._hparams_value("_hparams_/session_end_info", session_end_info=end)])
        self._file.close()


def resolve_mlflow_uri(log_dir, uri=None, environ=None):
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

    def __init__(self, log_dir, uri=None, experiment="hvdkit", run_name=None):
        self._ml = _import("mlflow")
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

    def log_params(self, params):
        """Record parameters (MLflow keeps them as strings and never changes them)."""
        self._client.log_batch(self.run_id, params=[self._ml.param(k, str(v)) for k, v in params.items()])

    def log_metrics(self, metrics, step):
        now = int(time.time() * 1000)
        self._client.log_batch(self.run_id, metrics=[self._ml.metric(k, v, now, step) for k, v in metrics.items()])

    def close(self, failed=False):
        self._client.set_terminated(self.run_id, "FAILED" if failed else "FINISHED")


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


def _check_metrics(metrics, step):
    if not isinstance(metrics, Mapping):
        raise ConfigError(f"metrics must be a mapping of names to numbers (got {type(metrics).__name__})")
    out = {}
    for name, value in metrics.items():
        if not isinstance(name, str) or not name:
            raise ConfigError(f"metric names must be non-empty strings (got {name!r})")
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
    from .. import __version__

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

    def __init__(self, comm, log_dir, backends=("tensorboard",), params=None, mlflow_uri=None,
                 experiment="hvdkit", run_name=None):
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
        if not isinstance(params, Mapping):
            raise ConfigError(f"params must be a mapping of names to values (got {type(params).__name__})")
        new = {}
        for k, v in params.items():
            if not isinstance(k, str) or not k:
                raise ConfigError(f"parameter names must be non-empty strings (got {k!r})")
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

    def log_params(self, params):
        """Record hyperparameters; a name already logged must keep its value (MLflow params never change).

        Collective: no.
        """
        self._check_open()
        self._record_params(self._new_params(params))

    def log_metrics(self, metrics, step):
        """Record ``{name: number}`` at ``step`` (an integer >= 0): values already averaged over ranks.

        Raises ConfigError on every rank for a non-numeric or non-finite value. Collective: no.
        """
        self._check_open()
        step = _check_step(step)
        values = _check_metrics(metrics, step)
        if self.tensorboard:
            self.tensorboard.add_scalars(values, step)
        if self.mlflow:
            self.mlflow.log_metrics(values, step)

    def close(self, failed=False):
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

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        self.close(failed=exc_type is not None)
        return False


def tracker_for(communicator):
    """A ``Tracker`` constructor bound to an adapter's ``communicator()`` (what ``hvdkit.torch.Tracker`` is)."""

    def make_tracker(log_dir, backends=("tensorboard",), params=None, mlflow_uri=None, experiment="hvdkit",
                     run_name=None):
        """Log parameters and job-wide metrics to TensorBoard and/or MLflow from rank 0 (see ``core.tracking.Tracker``).

        Collective: no (the metrics passed in must already be averaged over ranks).
        Env: MLFLOW_TRACKING_URI; sets MLFLOW_ALLOW_FILE_STORE for a ``file:`` URI.
        """
        return Tracker(communicator(), log_dir, backends=backends, params=params, mlflow_uri=mlflow_uri,
                       experiment=experiment, run_name=run_name)

    make_tracker.__name__ = make_tracker.__qualname__ = "Tracker"
    return make_tracker
