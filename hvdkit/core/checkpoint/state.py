"""What a checkpoint holds and how it comes back, for every framework (framework-free).

A checkpoint (layout 1, written by ``CheckpointerBase.save``) is two files::

    arrays.npz      every tensor: model/<n>, optimizer/<n>, scheduler/<n>, extra/<n>, rng/<rank>/<n>
    manifest.json   step, epoch, world size (the store's fields) and under "meta":
                    layout, extra, state (model, optimizer, scheduler trees), rng (one tree per rank)

The trees are ``tree.encode``'s JSON, naming their tensors' arrays; step, epoch, world
size and ``extra`` are stored once, in the manifest. A framework adapter subclasses
``CheckpointerBase`` and only turns its state into tensors and back (the ``_`` hooks below);
saving, reading, the RNG states of every rank, the scheduler, re-seeding at another world size and
the order of the collectives are the same for every framework. Checkpoints of earlier hvdkit
versions (no ``layout``) are read by the adapter's ``_read_legacy``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import CheckpointError, ConfigError
from ..log import get_logger
from ..topology import from_env as topology_from_env
from .arrays import ARRAYS, ArrayFile, write_arrays
from .background import DEFAULT_WRITER_PRIORITY, choose_writer_priority, writer_nice, writes_direct
from .folder import listing, verify
from .store import MANIFEST, CheckpointStore, Position, Resumed
from .tree import capture_rng, decode, encode, reseed_rng, restore_rng

if TYPE_CHECKING:
    from ..comm import Communicator

__all__ = ["CheckpointerBase", "Snapshot", "read_newest", "LAYOUT"]

LAYOUT = 1
_log = get_logger("checkpoint")


@dataclass(frozen=True)
class Snapshot(Position):
    """A checkpoint as read back: ``state`` holds ``model``, ``optimizer``, ``scheduler`` (arrays for tensors)."""

    extra: object
    state: dict
    rng: object  # one entry per rank of the job that wrote it; None when it saved none
    path: str


def _is_array(value):
    return isinstance(value, np.ndarray)


def read_layout(folder: str, manifest: dict[str, Any], load: Callable[[np.ndarray, Any, str], Any]) -> Snapshot:
    """``Snapshot`` of a layout-1 checkpoint; ``load(array, meta, name)`` turns an array into a tensor.

    ``name`` is the tree the array belongs to (``model``, ``extra``, ...). RNG arrays stay NumPy arrays.
    """
    meta = manifest["meta"]
    arrays = ArrayFile(os.path.join(folder, ARRAYS))

    def loader(name):
        return lambda array, tmeta: load(arrays.read(array, copy=name != "model" and name != "optimizer"), tmeta, name)

    state = {name: decode(tree, loader(name)) for name, tree in meta["state"].items()}
    rng = [decode(tree, lambda array, _: arrays.read(array, copy=True)) for tree in meta["rng"]]
    extra = decode(meta["extra"], loader("extra"))
    return Snapshot(manifest["step"], manifest["epoch"], manifest["world_size"], extra, state, rng, folder)


def read_newest(directory: str | os.PathLike[str]) -> Snapshot | None:
    """The newest checkpoint under ``directory`` that verifies, as a ``Snapshot`` of NumPy arrays, or None.

    For tests and tools (no collective, no lock, reads only): ``state["model"]`` is the model's
    arrays as the adapter stored them (torch: a dict by state-dict key; TensorFlow: a list in
    ``model.weights`` order). Checkpoints that fail verification are skipped.
    """
    for _, _, path in listing(os.path.abspath(os.fspath(directory))):
        try:
            manifest = verify(path)
        except CheckpointError:
            continue
        if manifest.get("meta", {}).get("layout") != LAYOUT:
            raise CheckpointError(
                f"{path} was written by an earlier hvdkit: restore it with the Checkpointer of its framework"
            )
        return read_layout(path, manifest, lambda array, tmeta, name: np.array(array))
    return None


class CheckpointerBase:
    """Saves and restores a model, optimizer, scheduler, step, epoch, every rank's RNG state and ``extra``.

    Subclasses (``hvdkit.torch.Checkpointer``, ``hvdkit.tensorflow.Checkpointer``) turn their
    framework's state into tensors and back; see the ``_`` methods. ``scheduler`` is anything with
    ``state_dict()`` and ``load_state_dict(state)``. ``seed`` re-seeds the RNGs at a resume with
    another world size. ``async_save`` makes ``save`` return once rank 0 copied the state into host
    memory, or sooner where the adapter can gate what changes the state (torch: a thread copies the
    parameters and the optimizer state until the optimizer's next ``step()``; see ``wait_copied``);
    a thread writes it (see ``save`` and ``wait``) at ``writer_priority`` ("normal", "low", "idle", or "auto":
    "idle" where training leaves a core free, else "normal"; ``background.choose_writer_priority``).
    ``direct_io``: write the arrays with O_DIRECT (True), through the page cache (False) or as
    ``writer_priority`` chooses (None; ``background.DIRECT_IO``).
    Collective: the constructor, ``save``, ``wait`` and ``restore`` are called by every rank.
    """

    def __init__(
        self,
        directory: str | os.PathLike[str],
        model: Any,
        optimizer: Any,
        scheduler: Any,
        keep: int,
        comm: Communicator,
        seed: int,
        framework: str,
        async_save: bool = False,
        writer_priority: str = DEFAULT_WRITER_PRIORITY,
        direct_io: bool | None = None,
    ) -> None:
        if not isinstance(async_save, bool):
            raise ConfigError(
                f"async_save must be True or False (got {async_save!r}): True writes checkpoints in the background"
            )
        writer_nice(writer_priority)  # a bad name fails before anything is looked at
        writer_priority, why = choose_writer_priority(writer_priority, *self._training_cpus(model))
        self.direct_io = writes_direct(writer_priority, direct_io)  # bad values fail before the folder is touched
        if async_save and why != "as asked" and comm.is_rank0:
            _log.info("background checkpoint writes at %r priority (writer_priority='auto'): %s", writer_priority, why)
        self.async_save = async_save
        self.writer_priority = writer_priority
        self.comm = comm
        self.seed = seed
        self.model = model
        self.optimizer = optimizer
        self.scheduler = scheduler
        self.store = CheckpointStore(directory, comm, keep=keep, framework=framework, writer_priority=writer_priority)

    # ------------------------------------------------------------ the framework's part
    @staticmethod
    def _training_cpus(model) -> tuple[bool, int, int]:
        """What ``writer_priority="auto"`` chooses by: whether ``model`` trains on an accelerator, the framework's
        compute threads per rank, and the ranks on this host (from the launcher's variables)."""
        return False, len(os.sched_getaffinity(0)), topology_from_env().local_size

    def _prepare(self):
        """Every rank, before a save or restore (build what must exist alike on every rank)."""

    def _is_tensor(self, value):
        raise NotImplementedError

    def _tensor_meta(self, tensor):
        """What ``_from_array`` needs besides the array (JSON-ready), or None."""
        return None

    def _to_array(self, tensor):
        """``tensor`` as a NumPy array (rank 0, at write time, one tensor at a time)."""
        raise NotImplementedError

    def _host_copies(self, items):
        """Rank 0, ``async_save``: ``(name, array)`` pairs holding copies of the tensors in ``items``.

        The copies must not change when training goes on (the write reads them in a thread).
        """
        return [(n, t if isinstance(t, np.ndarray) else np.array(self._to_array(t), copy=True)) for n, t in items]

    def _stage(self, items):
        """Rank 0, ``async_save``: ``(pairs, copy)``. ``pairs`` are ``_host_copies``' where the copy is made now;
        ``copy``, when not None, is called by the write thread before anything else and must make the
        rest (the adapter then gates what changes that state: ``background.wait_for_copies``)."""
        return self._host_copies(items), None

    def _from_array(self, array, meta, name):
        """The tensor ``_to_array`` gave ``array`` for; ``name`` is its tree (``model``, ``extra``, ...)."""
        raise NotImplementedError

    def _state(self):
        """Rank 0: ``{"model": tree, "optimizer": tree}`` of the framework's own tensors (not copied)."""
        raise NotImplementedError

    def _meta(self):
        """Small JSON-ready facts the adapter needs at restore, kept in the manifest."""
        return {}

    def _apply(self, snapshot):
        """Rank 0: load ``snapshot.state`` into the model and optimizer; CheckpointError if it does not fit."""
        raise NotImplementedError

    def _share(self):
        """Every rank: take rank 0's model and optimizer (the path a fresh start takes)."""
        raise NotImplementedError

    def _framework_rng(self):
        """This rank's framework RNG states, as NumPy arrays (in a dict)."""
        return {}

    def _set_framework_rng(self, state):
        """Set this rank's framework RNG states from ``_framework_rng``'s ``state``."""

    def _reseed_framework(self, value):
        """Seed the framework's RNGs with ``value`` (a resume at another world size)."""

    def _read_legacy(self, folder, manifest):
        """A ``Snapshot`` of a checkpoint an earlier hvdkit wrote (no ``layout`` in its manifest)."""
        raise CheckpointError(f"{folder} was written in a layout this version does not read")

    def _after_restore(self, snapshot_meta):
        """Every rank, after the state arrived; ``snapshot_meta`` is what ``_meta`` stored."""

    # ------------------------------------------------------------ save
    def save(self, step: int, epoch: int, extra: Any = None) -> str:
        """Write a checkpoint of ``step`` (rank 0 writes; every rank's RNG state is included).

        ``epoch`` is the number of epochs completed. Returns the checkpoint path on every rank.
        ``extra`` may hold None, bool, int, float, str, bytes, lists, tuples, dicts (scalar keys)
        and tensors; anything else (a NumPy scalar or array, a path, an object of your own class),
        in ``extra`` or in a state dict, raises ConfigError on every rank naming its key path and
        type, and nothing is written. With ``async_save``, see ``wait``.
        Collective: every rank calls it.
        """
        self.wait()
        self._prepare()
        rngs = self.comm.allgather_object(capture_rng(self._framework_rng()), name="hvdkit.checkpoint.rng")
        plan = {}

        def check():  # rank 0, before anything is written
            plan["arrays"], plan["meta"] = self._encode(rngs, extra)
            if self.async_save:  # training changes the tensors while the thread writes: copied first
                plan["arrays"], plan["copy"] = self._stage(plan["arrays"])

        def copy():  # rank 0, the write thread, before the write; the step (or a load) waits for it
            if plan.get("copy") is not None:
                plan["copy"]()

        def write(folder):
            items = ((n, t if isinstance(t, np.ndarray) else self._to_array(t)) for n, t in plan["arrays"])
            return {ARRAYS: write_arrays(os.path.join(folder, ARRAYS), items, direct=self.direct_io)}

        return self.store.save(
            write, step, epoch, meta=lambda: plan["meta"], check=check, background=self.async_save, copy=copy
        )

    def wait_copied(self) -> None:
        """Wait until the state of the background save in flight is copied (returns at once when it is).

        With ``async_save=True`` an adapter may copy part of the state after ``save`` returned, in
        the write thread, while forward and backward run (torch: the parameters and the optimizer
        state, when the optimizer is a ``torch.optim.Optimizer``). Whatever changes that state
        waits first on its own: the optimizer's ``step()`` (every torch optimizer of the process),
        ``load_state_dict`` of the model or the optimizer, and the next ``save``, ``wait`` or
        ``restore``. Changing a parameter in place by other means (``p.add_(...)`` under
        ``torch.no_grad()``, ``p.data = ...``) before the copy is done is not allowed: it may
        reach the checkpoint. Call ``wait_copied()`` first. No collective (rank 0 copies; the other
        ranks return at once).
        """
        self.store.wait_copied()

    def wait(self) -> str | None:
        """Wait for the checkpoint being written in the background; its path, or None when none was.

        With ``async_save=True``, ``save`` blocks only while rank 0 copies the state into host
        memory, then returns (with the path the checkpoint will have); a thread of rank 0 writes
        it (temporary folder, fsync, manifest, atomic rename, as a synchronous save). One write
        is in flight at a time: the next ``save`` first waits for the previous write (rank 0
        says once that it had to wait, and how long). ``save``, ``wait`` and ``restore`` share the
        outcome: a failed write raises CheckpointError on every rank there, naming its step and the
        cause (earlier checkpoints stay). Call it at the end of a hand-written loop, and before
        exiting on a preemption; at interpreter exit rank 0 still finishes the write, but a
        failure is then only logged. ``hvdkit.torch.Trainer`` calls it at the end of ``fit``.
        Collective: every rank calls it.
        """
        return self.store.wait()

    def _encode(self, rngs, extra):
        arrays = []
        state = dict(self._state())
        state["scheduler"] = self.scheduler.state_dict() if self.scheduler is not None else None
        trees = {k: encode(v, k, arrays, self._is_tensor, self._tensor_meta) for k, v in state.items()}
        meta = {
            **self._meta(),
            "layout": LAYOUT,
            "extra": encode(extra, "extra", arrays, self._is_tensor, self._tensor_meta),
            "state": trees,
            "rng": [encode(r, f"rng/{i}", arrays, _is_array) for i, r in enumerate(rngs)],
        }
        return arrays, meta

    # ------------------------------------------------------------ restore
    def restore(self) -> Resumed | None:
        """Load the newest good checkpoint on every rank; a ``Resumed``, or None when there is none.

        Rank 0 verifies the newest checkpoint (falling back to older ones), maps its arrays and
        loads them into its model and optimizer; every other rank then takes rank 0's state the
        way a fresh start does. Every rank loads the scheduler state and its own RNG states; at
        another world size the saved per-rank states cannot carry over, and every rank re-seeds
        Python, NumPy and the framework from ``(seed, step, rank)`` (logged on rank 0). A
        checkpoint that does not fit the model raises CheckpointError on every rank and is left
        untouched. A checkpoint still being written in the background is waited for first.
        Collective: every rank calls it.
        """
        self.wait()
        self._prepare()

        def describe(snapshot, info):  # rank 0; what it raises fails every rank
            self._apply(snapshot)
            meta = {k: v for k, v in info.manifest.get("meta", {}).items() if k not in ("extra", "state", "rng")}
            return {
                "extra": snapshot.extra,
                "scheduler": snapshot.state.get("scheduler"),
                "rng": snapshot.rng,
                "meta": meta,
            }

        loaded = self.store.load_on_rank0(self._read, describe)
        if loaded is None:
            return None
        _, header, info = loaded
        self._share()
        if self.scheduler is not None and header["scheduler"] is not None:
            self._load_scheduler(header["scheduler"], info.path)
        self._restore_rng(header["rng"], info.step)
        self._after_restore(header["meta"])
        if self.comm.is_rank0:
            _log.info("resumed from %s (step %d, epoch %d)", info.path, info.step, info.epoch)
        return Resumed(info.step, info.epoch, info.world_size, header["extra"], info.path)

    def _load_scheduler(self, state, path):
        """Every rank, once, after the optimizer arrived (a rescaling scheduler reads its rates)."""
        try:
            self.scheduler.load_state_dict(state)
        except (RuntimeError, ValueError, KeyError, TypeError) as e:
            raise CheckpointError(
                f"the scheduler state in checkpoint {path} does not fit {type(self.scheduler).__name__} "
                f"({str(e).splitlines()[0] if str(e) else type(e).__name__}); pass the scheduler this run saved, "
                "or point --checkpoint-dir at an empty directory"
            ) from e

    def _read(self, folder):
        """Rank 0: the ``Snapshot`` of the verified checkpoint ``folder``."""
        with open(os.path.join(folder, MANIFEST), encoding="utf-8") as f:
            manifest = json.load(f)
        if manifest.get("meta", {}).get("layout") == LAYOUT:
            return read_layout(folder, manifest, self._from_array)
        if "layout" in manifest.get("meta", {}):
            raise CheckpointError(f"{folder} has layout {manifest['meta']['layout']!r}, written by a newer hvdkit")
        return self._read_legacy(folder, manifest)

    def _restore_rng(self, rngs, step):
        if rngs is None:  # an earlier hvdkit's TensorFlow checkpoint: no RNG states were saved
            return
        if len(rngs) == self.comm.size:
            self._set_framework_rng(restore_rng(rngs[self.comm.rank]))
            return
        self._reseed_framework(reseed_rng(self.seed, step, self.comm.rank))
        if self.comm.is_rank0:
            _log.warning(
                "checkpoint was written by %d ranks, this job has %d: data is re-sharded by global sample "
                "offset, RNG states re-seeded from (seed %d, step %d, rank)",
                len(rngs),
                self.comm.size,
                self.seed,
                step,
            )
