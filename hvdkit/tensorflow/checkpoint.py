"""Rank-0 checkpoints of a TensorFlow/Keras model and optimizer, with automatic resume."""

import io
import os
import zipfile

import numpy as np

from ..core.checkpoint import CheckpointStore, Resumed
from ..core.errors import CheckpointError
from ..core.log import get_logger
from ..core.plain_data import check_json_plain
from .runtime import communicator

__all__ = ["Checkpointer", "Resumed"]

STATE_FILE = "state.npz"
_ACCUMULATOR = "_gradient_accumulator"  # Keras 3 names its accumulators <variable>_gradient_accumulator
_log = get_logger("checkpoint")


def _values(variables):
    return [np.asarray(v.numpy() if hasattr(v, "numpy") else v) for v in variables]


class Checkpointer:
    """Saves and restores a model's weights, its optimizer's variables, step, epoch and ``extra``.

    ``model`` is anything with ``.weights`` (a Keras model); ``optimizer`` a Keras optimizer (its
    variables include the iteration count, so learning-rate schedules continue). Keras's gradient
    accumulators are not saved: they hold a partial sum only between the batches of one optimizer
    step, so save after complete steps (``fit`` callbacks at epoch ends do). A checkpoint restored
    with another accumulation (a fixed global batch at another world size) continues at the same
    optimizer step: the raw batch counter is converted. Files are plain
    arrays (``.npz``, read with ``allow_pickle=False``) under the core's rank-0 protocol; ``extra``
    (plain JSON data) is kept in the manifest.

    Collective: the constructor, ``save`` and ``restore`` are called by every rank.
    """

    def __init__(self, directory, model, optimizer=None, keep=3, comm=None):
        import tensorflow as tf

        self.comm = comm or communicator()
        self.model = model
        self.optimizer = optimizer
        self.store = CheckpointStore(directory, self.comm, keep=keep, framework=f"tensorflow {tf.__version__}")

    def _optimizer_variables(self):
        opt = self.optimizer
        if opt is None:
            return []
        if not opt.built:
            opt.build(self.model.trainable_variables)
        return [v for v in opt.variables if not v.name.endswith(_ACCUMULATOR)]

    def _accumulation(self):
        return int(getattr(self.optimizer, "gradient_accumulation_steps", None) or 1)

    def _convert_iterations(self, saved_accumulation):
        """Rescale Keras's raw batch counter from the saved accumulation to this optimizer's (every rank)."""
        now = self._accumulation()
        if self.optimizer is None or saved_accumulation == now:
            return
        for v in self.optimizer.variables:
            if v.name == "iteration":
                v.assign(int(v.numpy()) // saved_accumulation * now)

    def save(self, step, epoch, extra=None):
        """Write a checkpoint of ``step``; ``epoch`` is the number of epochs completed.

        ``extra`` is kept in the manifest as JSON: what JSON would not give back as it was (a
        tuple, a non-string key, a NumPy value, a path) raises ConfigError on every rank naming its
        key path and type, and nothing is written. Collective: every rank calls it.
        """
        opt_vars = self._optimizer_variables()  # builds the optimizer on every rank alike
        model_vals = _values(self.model.weights) if self.comm.is_rank0 else None
        opt_vals = _values(opt_vars) if self.comm.is_rank0 else None

        def write(folder):
            arrays = {f"model/{i}": v for i, v in enumerate(model_vals)}
            arrays.update({f"optimizer/{i}": v for i, v in enumerate(opt_vals)})
            buf = io.BytesIO()
            np.savez(buf, **arrays)
            with open(os.path.join(folder, STATE_FILE), "wb") as f:
                f.write(buf.getvalue())

        meta = {"extra": extra, "accumulation": self._accumulation()}
        return self.store.save(write, step, epoch, meta=meta, check=lambda: check_json_plain(extra, "extra"))

    def restore(self):
        """Load the newest good checkpoint into the model and optimizer on every rank.

        Returns a ``Resumed`` (``epoch`` is what to pass as ``initial_epoch``) or None when there is
        no checkpoint. A checkpoint that does not fit the model raises CheckpointError on every
        rank and is left untouched. Rank 0 reads the arrays one at a time into its variables; the
        other ranks receive them variable by variable, in bounded chunks: no rank holds a pickled
        copy of the state. Collective: every rank calls it.
        """
        variables = {"model": list(self.model.weights), "optimizer": self._optimizer_variables()}

        def describe(saved, info):  # rank 0; what it raises fails every rank
            self._apply(saved, variables, info.path)
            return _specs(variables)

        loaded = self.store.load_on_rank0(_read_state, describe)
        if loaded is None:
            return None
        _, header, info = loaded
        self._receive(header, variables)
        meta = info.manifest.get("meta", {})
        self._convert_iterations(int(meta.get("accumulation", self._accumulation())))
        if self.comm.is_rank0:
            _log.info("resumed from %s (step %d, epoch %d)", info.path, info.step, info.epoch)
        extra = meta.get("extra")
        return Resumed(info.step, info.epoch, extra, info.path, info.world_size)

    @staticmethod
    def _apply(saved, variables, path):
        """Rank 0: assign the saved arrays, read one at a time, after checking that all fit."""
        for what, vs in variables.items():
            shapes = [tuple(v.shape) for v in vs]
            held = [shape for shape, _ in saved[what]]
            if shapes != held:
                raise CheckpointError(
                    f"checkpoint {path} does not fit this {what}: it holds {len(held)} arrays {held[:3]}..., "
                    f"the {what} has {len(shapes)} variables {shapes[:3]}...; point the checkpoint directory at the "
                    "checkpoints of this model, or at an empty directory"
                )
        with np.load(saved["path"], allow_pickle=False) as z:
            for what, vs in variables.items():
                for i, v in enumerate(vs):
                    v.assign(z[f"{what}/{i}"])

    def _receive(self, header, variables):
        """Every rank: rank 0's variables, one at a time, in bounded chunks (see ``broadcast_tensors``)."""
        comm = self.comm
        if comm.size == 1:
            return
        mine = _specs(variables)
        problem = None if comm.is_rank0 or mine == header else f"its variables {_mismatch(mine, header)}"
        problems = comm.allgather_object(problem, name="hvdkit.checkpoint.restore.fit")
        bad = [(r, p) for r, p in enumerate(problems) if p]
        if bad:
            raise CheckpointError(
                f"rank {bad[0][0]} cannot take rank 0's checkpoint: {bad[0][1]}; every rank must build the same model and optimizer"
            )
        specs = header["model"] + header["optimizer"]
        for k, (v, (shape, dtype)) in enumerate(zip(variables["model"] + variables["optimizer"], specs)):
            buf = np.ascontiguousarray(v.numpy()) if comm.is_rank0 else np.empty(shape, dtype)
            comm.broadcast_tensors([buf], name=f"hvdkit.checkpoint.restore.{k}")
            if not comm.is_rank0:
                v.assign(buf)


def _np_dtype(v):
    return np.dtype(getattr(v.dtype, "as_numpy_dtype", v.dtype)).str


def _specs(variables):
    """``{"model": [(shape, dtype)], "optimizer": [...]}`` of the variables: a restore's header."""
    return {what: [(tuple(v.shape), _np_dtype(v)) for v in vs] for what, vs in variables.items()}


def _mismatch(mine, theirs):
    for what in mine:
        if len(mine[what]) != len(theirs[what]):
            return f"({what}) are {len(mine[what])} here, {len(theirs[what])} on rank 0"
        for i, (a, b) in enumerate(zip(mine[what], theirs[what])):
            if a != b:
                return f"({what} variable {i}) is {a[0]} {np.dtype(a[1]).name} here, {b[0]} {np.dtype(b[1]).name} on rank 0"
    return "differ"


def _read_state(folder):
    """The saved arrays' shapes and dtypes (read from their headers; the data stays on disk)."""
    path = os.path.join(folder, STATE_FILE)
    specs = {"model": {}, "optimizer": {}}
    with zipfile.ZipFile(path) as zf:
        for member in zf.namelist():
            what, _, index = member.removesuffix(".npy").partition("/")
            with zf.open(member) as f:
                version = np.lib.format.read_magic(f)
                read_header = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
                shape, _, dtype = read_header(f)
            if dtype.hasobject:
                raise CheckpointError(f"{path}: {member} holds Python objects, which are not loaded")
            specs[what][int(index)] = (tuple(shape), dtype.str)
    return {"path": path, **{what: [s[i] for i in range(len(s))] for what, s in specs.items()}}
