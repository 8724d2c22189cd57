"""Rank-0 checkpoints of a TensorFlow/Keras model and optimizer, with automatic resume.

The format, the RNG states of every rank, the scheduler and the order of the collectives are the
core's (``hvdkit.core.checkpoint.state``); this module only turns variables into arrays and back.
"""

from __future__ import annotations

import os
import warnings
from typing import TYPE_CHECKING, Any

import numpy as np

from ..core.checkpoint.arrays import ArrayFile
from ..core.checkpoint.background import DEFAULT_WRITER_PRIORITY
from ..core.checkpoint.state import CheckpointerBase, Snapshot
from ..core.checkpoint.store import Resumed
from ..core.errors import CheckpointError
from ..core.topology import from_env as topology_from_env
from ..core.zero import ShardedState
from ._engine import horovod_tf
from .runtime import communicator
from .variables import broadcast_variables

if TYPE_CHECKING:
    from ..core.comm import Communicator

__all__ = ["Checkpointer", "Resumed"]

LEGACY_STATE_FILE = "state.npz"  # hvdkit before the shared layout: model/<i> and optimizer/<i> arrays
_ACCUMULATOR = "_gradient_accumulator"  # Keras 3 names its accumulators <variable>_gradient_accumulator
_NUMPY_DTYPES = frozenset(
    {
        "float64",
        "float32",
        "float16",
        "complex64",
        "complex128",
        "int64",
        "int32",
        "int16",
        "int8",
        "uint64",
        "uint32",
        "uint16",
        "uint8",
        "bool",
    }
)


def _dtype_name(v):
    return str(getattr(v.dtype, "name", v.dtype))


class Checkpointer(CheckpointerBase):
    """Saves and restores a model's weights, its optimizer's variables, a scheduler, step, epoch,
    every rank's RNG states and ``extra``.

    ``model`` is anything with ``.weights`` (a Keras model); ``optimizer`` a Keras optimizer (its
    variables include the iteration count, so learning-rate schedules continue); ``scheduler``
    anything with ``state_dict()`` and ``load_state_dict(state)``. Keras's gradient accumulators
    are not saved: they hold a partial sum only between the batches of one optimizer step, so
    save after complete steps (``fit`` callbacks at epoch ends do). A checkpoint restored with
    another accumulation (a fixed global batch at another world size) continues at the same
    optimizer step: the raw batch counter is converted. The RNG states are Python's, NumPy's,
    TensorFlow's global generator and the model's seed generators (dropout). Variables are written
    one at a time (no second copy of the state); ``extra`` takes the same data as torch's
    (tensors included) and comes back with the same types. ``seed`` re-seeds at another world size.
    ``async_save=True``: ``save`` blocks only while rank 0 reads the variables into NumPy arrays of
    its own, then a thread writes them; see ``wait`` (memory: one more copy of the state on rank 0
    while a write is in flight). ``writer_priority``: "auto" (the default), "normal", "low" or "idle", and
    ``direct_io`` (O_DIRECT writes), as torch's.

    Collective: the constructor, ``save``, ``wait`` and ``restore`` are called by every rank.
    """

    def __init__(
        self,
        directory: str | os.PathLike[str],
        model: Any,
        optimizer: Any = None,
        scheduler: Any = None,
        keep: int = 3,
        comm: Communicator | None = None,
        seed: int = 0,
        async_save: bool = False,
        writer_priority: str = DEFAULT_WRITER_PRIORITY,
        direct_io: bool | None = None,
    ) -> None:
        import tensorflow as tf

        if isinstance(scheduler, int) and not isinstance(scheduler, bool):  # the signature before ``scheduler``
            warnings.warn(
                "Checkpointer(directory, model, optimizer, keep, comm): pass keep= and comm= by name; "
                "the fourth argument is the scheduler now",
                DeprecationWarning,
                stacklevel=2,
            )
            scheduler, keep, comm = None, scheduler, keep if comm is None and not isinstance(keep, int) else comm
        super().__init__(
            directory,
            model,
            optimizer,
            scheduler,
            keep,
            comm or communicator(),
            seed,
            framework=f"tensorflow {tf.__version__}",
            async_save=async_save,
            writer_priority=writer_priority,
            direct_io=direct_io,
        )
        self._opt_vars = []
        self._consolidated = None  # a sharded optimizer's unsharded variables (rank 0, during save)
        self._pending = None  # the saved optimizer arrays for a sharded optimizer (rank 0, during restore)

    def save(self, step: int, epoch: int, extra: Any = None) -> str:
        """Write a checkpoint of ``step`` (rank 0 writes; every rank's RNG state is included).

        ``epoch`` is the number of epochs completed. Returns the checkpoint path on every rank.
        ``extra`` may hold None, bool, int, float, str, bytes, lists, tuples, dicts (scalar keys)
        and tensors; anything else (a NumPy scalar or array, a path, an object of your own class),
        in ``extra`` or in a state dict, raises ConfigError on every rank naming its key path and
        type, and nothing is written. A sharded optimizer (``shard_optimizer_state=True``) is saved as the
        unsharded one, gathered to rank 0 first, so any world size restores it, sharded or not.
        With ``async_save``, see ``wait``. Collective: every rank calls it.
        """
        self.wait()  # before anything else: every rank learns how the previous write went
        if self._sharded():
            self._prepare()
            self._consolidated = self.optimizer.consolidate(to=0)
        try:
            return CheckpointerBase.save(self, step, epoch, extra)
        finally:
            self._consolidated = None

    restore = CheckpointerBase.restore  # named here so that the API reference, made from own members, lists it
    wait = CheckpointerBase.wait
    wait_copied = CheckpointerBase.wait_copied

    def _sharded(self):
        return isinstance(self.optimizer, ShardedState)

    @staticmethod
    def _training_cpus(model):
        """``writer_priority="auto"``: whether TensorFlow trains on a GPU, its intra-op threads, the host's ranks."""
        import tensorflow as tf

        threads = tf.config.threading.get_intra_op_parallelism_threads() or len(os.sched_getaffinity(0))
        return bool(tf.config.get_visible_devices("GPU")), threads, topology_from_env().local_size

    def _prepare(self):
        self._opt_vars = self._optimizer_variables()  # builds the optimizer on every rank alike

    def _optimizer_variables(self):
        opt = self.optimizer
        if opt is None:
            return []
        if not opt.built:
            opt.build(self.model.trainable_variables)
        return [v for v in opt.variables if not v.name.endswith(_ACCUMULATOR)]

    def _variables(self):
        return {"model": list(self.model.weights), "optimizer": self._opt_vars}

    def _optimizer_specs(self):
        """``(shape, dtype name)`` of the optimizer's variables as saved (a sharded optimizer's: unsharded)."""
        if self._sharded():
            return [(tuple(shape), dtype) for shape, dtype in self.optimizer.unsharded_specs()]
        return [(tuple(v.shape), _dtype_name(v)) for v in self._opt_vars]

    def _accumulation(self):
        return int(getattr(self.optimizer, "gradient_accumulation_steps", None) or 1)

    # ------------------------------------------------------------ tensors and arrays
    def _is_tensor(self, value):
        import tensorflow as tf

        return tf.is_tensor(value) or isinstance(value, tf.Variable)  # Keras 3 variables are tensors to TF

    def _tensor_meta(self, tensor):
        name = _dtype_name(tensor)
        return None if name in _NUMPY_DTYPES else [name, list(tensor.shape)]  # stored as raw bytes

    def _to_array(self, tensor):
        array = np.asarray(tensor.numpy())
        return array if _dtype_name(tensor) in _NUMPY_DTYPES else np.ascontiguousarray(array).reshape(-1).view(np.uint8)

    def _from_array(self, array, meta, name):
        import tensorflow as tf

        if meta is not None:
            array = array.view(tf.dtypes.as_dtype(meta[0]).as_numpy_dtype).reshape(meta[1])
        return array if name in ("model", "optimizer") else tf.convert_to_tensor(array)

    def _state(self):
        if self._sharded():
            import tensorflow as tf

            return {"model": list(self.model.weights), "optimizer": [tf.constant(a) for a in self._consolidated]}
        return self._variables()

    def _meta(self):
        return {"accumulation": self._accumulation()}

    # ------------------------------------------------------------ restore
    def _apply(self, snapshot):
        """Rank 0: assign the saved arrays, one at a time, after checking that all fit."""
        variables = self._variables()
        for what, vs in variables.items():
            shapes = [s for s, _ in self._optimizer_specs()] if what == "optimizer" else [tuple(v.shape) for v in vs]
            held = [tuple(a.shape) for a in snapshot.state.get(what) or []]
            if shapes != held:
                raise CheckpointError(
                    f"checkpoint {snapshot.path} does not fit this {what}: it holds {len(held)} arrays {held[:3]}..., "
                    f"the {what} has {len(shapes)} variables {shapes[:3]}...; point the checkpoint directory at the "
                    "checkpoints of this model, or at an empty directory"
                )
        if self._sharded():  # every rank takes its slices in _share
            self._pending = snapshot.state["optimizer"]
            variables = {"model": variables["model"]}
        for what, vs in variables.items():
            for v, array in zip(vs, snapshot.state[what], strict=True):
                v.assign(array)

    def _share(self):
        """Every rank: rank 0's variables, after checking that every rank's fit (CheckpointError if not)."""
        comm = self.comm
        if self._sharded():
            self._share_sharded()
            return
        if comm.size == 1:
            return
        variables = self._variables()
        mine = _specs(variables)
        everyone = comm.allgather_object(mine, name="hvdkit.checkpoint.restore.fit")
        bad = [(r, f"its variables {_mismatch(s, everyone[0])}") for r, s in enumerate(everyone) if s != everyone[0]]
        if bad:
            raise CheckpointError(
                f"rank {bad[0][0]} cannot take rank 0's checkpoint: {bad[0][1]}; "
                "every rank must build the same model and optimizer"
            )
        broadcast_variables(variables["model"] + variables["optimizer"], root_rank=0)  # as at a fresh start

    def _share_sharded(self):
        """Every rank: rank 0's model, and its slices of the unsharded optimizer arrays rank 0 read."""
        import tensorflow as tf

        comm = self.comm
        hvd = horovod_tf()
        pending, self._pending = self._pending, None
        specs = self._optimizer_specs()
        if comm.size > 1:
            mine = {"model": _specs({"model": self.model.weights})["model"], "optimizer": specs}
            everyone = comm.allgather_object(mine, name="hvdkit.checkpoint.restore.fit")
            bad = [(r, _mismatch(s, everyone[0])) for r, s in enumerate(everyone) if s != everyone[0]]
            if bad:
                raise CheckpointError(
                    f"rank {bad[0][0]} cannot take rank 0's checkpoint: its variables {bad[0][1]}; "
                    "every rank must build the same model and optimizer"
                )
            broadcast_variables(list(self.model.weights), root_rank=0)

        def values():  # one whole variable at a time, from rank 0
            for i, (shape, dtype) in enumerate(specs):
                if comm.size == 1:
                    yield pending[i]
                    continue
                held = pending[i] if comm.is_rank0 else np.zeros(shape, dtype=tf.dtypes.as_dtype(dtype).as_numpy_dtype)
                yield hvd.broadcast(tf.constant(held), root_rank=0, name=f"hvdkit.checkpoint.zero.{i}").numpy()

        self.optimizer.load_unsharded(values())

    def _after_restore(self, meta):
        """Rescale Keras's raw batch counter from the saved accumulation to this optimizer's (every rank)."""
        saved, now = int(meta.get("accumulation", self._accumulation())), self._accumulation()
        if self.optimizer is None or saved == now:
            return
        for v in self.optimizer.variables:
            if v.name == "iteration":
                v.assign(int(v.numpy()) // saved * now)

    # ------------------------------------------------------------ RNG states
    def _seed_generators(self):
        """The state variables of the model's seed generators (dropout and other random layers)."""
        weights = {id(v) for v in self.model.weights}
        return [v for v in getattr(self.model, "variables", []) if id(v) not in weights]

    def _framework_rng(self):
        import tensorflow as tf

        return {
            "tf": tf.random.get_global_generator().state.numpy(),
            "seeds": [np.asarray(v.numpy()) for v in self._seed_generators()],
        }

    def _set_framework_rng(self, state):
        import tensorflow as tf

        tf.random.get_global_generator().reset(state["tf"])
        seeds = self._seed_generators()
        if len(seeds) == len(state["seeds"]):
            for v, value in zip(seeds, state["seeds"], strict=True):
                v.assign(value)

    def _reseed_framework(self, value):
        import tensorflow as tf

        tf.random.set_seed(value & 0xFFFFFFFF)  # Python and NumPy got the same value (core.checkpoint.tree.reseed_rng)
        tf.random.get_global_generator().reset_from_seed(value)

    def _read_legacy(self, folder, manifest):
        """A checkpoint of hvdkit before the shared layout: ``state.npz``, ``extra`` in the manifest, no RNG states."""
        if LEGACY_STATE_FILE not in manifest.get("files", {}):
            raise CheckpointError(f"{folder} holds no TensorFlow checkpoint (framework: {manifest.get('framework')!r})")
        arrays = ArrayFile(os.path.join(folder, LEGACY_STATE_FILE))
        state = {}
        for what in ("model", "optimizer"):
            count = sum(1 for n in arrays.names() if n.startswith(f"{what}/"))
            state[what] = [arrays.read(f"{what}/{i}") for i in range(count)]
        extra = manifest.get("meta", {}).get("extra")
        return Snapshot(manifest["step"], manifest["epoch"], manifest["world_size"], extra, state, None, folder)


def _np_dtype(v):
    return np.dtype(getattr(v.dtype, "as_numpy_dtype", v.dtype)).str


def _specs(variables):
    """``{"model": [(shape, dtype)], "optimizer": [...]}`` of the variables."""
    return {what: [(tuple(v.shape), _np_dtype(v)) for v in vs] for what, vs in variables.items()}


def _mismatch(mine, theirs):
    for what in mine:
        if len(mine[what]) != len(theirs[what]):
            return f"({what}) are {len(mine[what])} here, {len(theirs[what])} on rank 0"
        for i, (a, b) in enumerate(zip(mine[what], theirs[what], strict=True)):
            if a != b:
                here, there = f"{a[0]} {np.dtype(a[1]).name}", f"{b[0]} {np.dtype(b[1]).name}"
                return f"({what} variable {i}) is {here} here, {there} on rank 0"
    return "differ"
