"""TensorBoard event files written without TensorFlow: scalars, a parameter table and hparams sessions.

TensorBoard's own writer imports TensorFlow on its first write (seconds and hundreds of MB in a
torch job); this one uses only ``tensorboard``'s protobuf classes and its TensorFlow-free hparams and
text plugin metadata helpers, imported when a writer is made, and frames each event with
``tfrecord.frame_record`` (the bytes are those TensorBoard's ``RecordWriter`` would write).
"""

from __future__ import annotations

import math
import os
import socket
import time
from collections.abc import Mapping
from types import SimpleNamespace
from typing import Any

from ..errors import MissingDependencyError
from .tfrecord import frame_record

__all__ = ["TensorBoardWriter"]

_INSTALL = "run `make setup`, or `pip install tensorboard mlflow-skinny sqlalchemy alembic`"


def _protos():
    """TensorBoard's protobuf modules, imported now; MissingDependencyError saying how to get them."""
    try:
        from tensorboard.compat.proto import event_pb2, summary_pb2, tensor_pb2, types_pb2
        from tensorboard.plugins.hparams import metadata as hparams_metadata
        from tensorboard.plugins.hparams import plugin_data_pb2
        from tensorboard.plugins.text import metadata as text_metadata
    except ImportError as e:
        missing = e.name or "tensorboard"
        raise MissingDependencyError(f"the tensorboard tracking backend needs {missing}; {_INSTALL}") from e
    return SimpleNamespace(
        event=event_pb2,
        summary=summary_pb2,
        tensor=tensor_pb2,
        types=types_pb2,
        hparams=plugin_data_pb2,
        hparams_meta=hparams_metadata,
        text_meta=text_metadata,
    )


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

    def __init__(self, log_dir: str | os.PathLike[str]) -> None:
        self._pb = _protos()
        os.makedirs(log_dir, exist_ok=True)
        name = f"events.out.tfevents.{int(time.time()):010d}.{socket.gethostname()}.{os.getpid()}.hvdkit"
        self.path = os.path.join(log_dir, name)
        self._file = open(self.path, "wb")  # noqa: SIM115 - open until close()
        self._params, self._params_dirty, self._session_started = {}, False, False
        self._write_event(file_version="brain.Event:2")
        self._file.flush()

    def _write_event(self, **fields):
        self._file.write(frame_record(self._pb.event.Event(wall_time=time.time(), **fields).SerializeToString()))

    def _write(self, step, values):
        self._write_event(step=step, summary=self._pb.summary.Summary(value=values))

    def _hparams_value(self, tag, **fields):
        """A session start or end for the hparams plugin, through TensorBoard's own (TensorFlow-free) metadata."""
        meta = self._pb.hparams_meta
        data = meta.create_summary_metadata(self._pb.hparams.HParamsPluginData(**fields))
        return self._pb.summary.Summary.Value(tag=tag, metadata=data, tensor=meta.NULL_TENSOR)

    def add_params(self, params: Mapping[str, Any]) -> None:
        """Remember parameters; they are written with the next scalars (or at ``close``)."""
        self._params.update(params)
        self._params_dirty = True

    def _flush_params(self, step):
        if not self._params_dirty:
            return
        pb = self._pb
        text = pb.tensor.TensorProto(dtype=pb.types.DT_STRING, string_val=[_markdown_table(self._params).encode()])
        text_meta = self._pb.text_meta.create_summary_metadata(display_name="", description="")
        values = [pb.summary.Summary.Value(tag="params", metadata=text_meta, tensor=text)]
        if not self._session_started:
            start = pb.hparams.SessionStartInfo(start_time_secs=time.time())
            for k, v in self._params.items():
                if isinstance(v, bool):
                    start.hparams[k].bool_value = v
                elif isinstance(v, (int, float)) and math.isfinite(v):
                    start.hparams[k].number_value = v
                else:
                    start.hparams[k].string_value = str(v)
            values.append(self._hparams_value(pb.hparams_meta.SESSION_START_INFO_TAG, session_start_info=start))
            self._session_started = True
        self._write(step, values)
        self._params_dirty = False

    def add_scalars(self, scalars: Mapping[str, float], step: int) -> None:
        """Write ``{tag: float}`` at ``step`` (float32 in the file, as TensorBoard stores scalars)."""
        self._flush_params(step)
        self._write(step, [self._pb.summary.Summary.Value(tag=k, simple_value=v) for k, v in scalars.items()])
        self._file.flush()

    def close(self, failed: bool = False) -> None:
        """Write pending parameters and the session's end (success or failure), then close the file."""
        if self._file.closed:
            return
        self._flush_params(0)
        if self._session_started:
            status = 2 if failed else 1  # tensorboard.hparams.Status: STATUS_FAILURE, STATUS_SUCCESS
            end = self._pb.hparams.SessionEndInfo(status=status, end_time_secs=time.time())
            tag = self._pb.hparams_meta.SESSION_END_INFO_TAG
            self._write(0, [self._hparams_value(tag, session_end_info=end)])
        self._file.close()
