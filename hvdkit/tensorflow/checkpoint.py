"""Rank-0 checkpoints of a TensorFlow/Keras model and optimizer, with automatic resume."""

import io
import os

import numpy as np

from ..core.checkpoint import CheckpointStore, Resumed
from ..core.errors import CheckpointError
from ..core.log import get_logger
from ..core.plain_data import check_json_plain
from .runtime import communicator

__all__ = ["Checkpointer", "Resumed"]

STATE_FILE = "state.npz"
_log = get_logger("checkpoint")


def _values(variables):
    return [np.asarray(v.numpy() if hasattr(v, "numpy") else v) for v in variables]


class Checkpointer:
    """Saves and restores a model's weights, its optimizer's variables, step, epoch and ``extra``.

    ``model`` is anything with ``.weights`` (a Keras model); ``optimizer`` a Keras optimizer (its
    variables include the iteration count, so learning-rate schedules continue). Files are plain
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
        return list(opt.variables)

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

        return self.store.save(write, step, epoch, meta={"extra": extra}, check=lambda: check_json_plain(extra, "extra"))

    def restore(self):
        """Load the newest good checkpoint into the model and optimizer on every rank.

        Returns a ``Resumed`` (``epoch`` is what to pass as ``initial_epoch``) or None when there is
        no checkpoint. A checkpoint that does not fit the model raises CheckpointError on every
        rank and is left untouched.
        """
        loaded = self.store.load(_read_state)
        if loaded is None:
            return None
        (model_vals, opt_vals), info = loaded
        self._assign("model", self.model.weights, model_vals, info.path)
        self._assign("optimizer", self._optimizer_variables(), opt_vals, info.path)
        if self.comm.is_rank0:
            _log.info("resumed from %s (step %d, epoch %d)", info.path, info.step, info.epoch)
        extra = info.manifest.get("meta", {}).get("extra")
        return Resumed(info.step, info.epoch, extra, info.path, info.world_size)

    @staticmethod
    def _assign(what, variables, values, path):
        shapes = [tuple(v.shape) for v in variables]
        saved = [tuple(v.shape) for v in values]
        if shapes != saved:
            raise CheckpointError(
                f"checkpoint {path} does not fit this {what}: it holds {len(saved)} arrays {saved[:3]}..., "
                f"the {what} has {len(shapes)} variables {shapes[:3]}...; point the checkpoint directory at the "
                "checkpoints of this model, or at an empty directory"
            )
        for v, value in zip(variables, values):
            v.assign(value)


def _read_state(folder):
    with np.load(os.path.join(folder, STATE_FILE), allow_pickle=False) as z:
        model = [z[f"model/{i}"] for i in range(sum(k.startswith("model/") for k in z.files))]
        opt = [z[f"optimizer/{i}"] for i in range(sum(k.startswith("optimizer/") for k in z.files))]
    return model, opt
