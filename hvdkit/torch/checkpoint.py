"""Rank-0 checkpoints of a torch training run, with automatic resume.

The format, the RNG states of every rank, the scheduler and the order of the collectives are the
core's (``hvdkit.core.checkpoint.state``); this module only turns torch state into arrays and back.
"""

from __future__ import annotations

import contextlib
import os
import weakref
from collections import OrderedDict
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch.optim.optimizer import register_optimizer_step_pre_hook

from ..core.checkpoint.background import DEFAULT_WRITER_PRIORITY, wait_for_copies
from ..core.checkpoint.state import CheckpointerBase, Snapshot
from ..core.checkpoint.store import Resumed
from ..core.checkpoint.tree import reseed_rng
from ..core.errors import CheckpointError
from ..core.topology import from_env as topology_from_env
from ..core.zero import ShardedState
from .runtime import communicator
from .state import share_state

if TYPE_CHECKING:
    from ..core.comm import Communicator

__all__ = ["Checkpointer", "Resumed"]

LEGACY_STATE_FILE = "state.pt"  # hvdkit before the shared layout: one torch.save of everything
_NUMPY_DTYPES = frozenset(
    {
        torch.float64,
        torch.float32,
        torch.float16,
        torch.complex64,
        torch.complex128,
        torch.int64,
        torch.int32,
        torch.int16,
        torch.int8,
        torch.uint8,
        torch.bool,
    }
)


def reseed(seed: int, step: int, rank: int) -> int:
    """Seed torch, Python's ``random`` and NumPy's global RNGs from ``(seed, step, rank)`` alone; the seed used."""
    value = reseed_rng(seed, step, rank)
    torch.manual_seed(value)
    return value


class Checkpointer(CheckpointerBase):
    """Saves and restores model, optimizer, LR scheduler, step, epoch, every rank's RNG states and ``extra``.

    Files go under ``directory`` through the core's rank-0 protocol (atomic, verified, newest
    ``keep`` kept): the tensors as arrays, everything else as JSON in the manifest, so reading a
    checkpoint runs no pickled code. ``seed`` re-seeds the RNGs when a checkpoint is restored at
    another world size (see ``restore``). ``extra`` holds plain data: None, bool, int, float, str,
    bytes, lists, tuples, dicts and tensors; it comes back with the same types.
    Rank 0 maps the arrays into memory and loads them into its own model and optimizer; the other
    ranks receive rank 0's tensors in bounded chunks straight into their parameters and buffers
    (the path ``broadcast_state`` takes at a fresh start): no rank holds a pickled copy of the state.

    ``async_save=True``: ``save`` returns before the state is written; a thread of rank 0 copies it
    into host memory (CUDA tensors into pinned memory) and writes the copy; see ``wait``. Buffers
    (batch-norm statistics change in forward), the scheduler and ``extra`` are copied in ``save``;
    the parameters and the optimizer state, when the optimizer is a ``torch.optim.Optimizer``, by
    the thread while forward and backward run: the optimizer's next ``step()`` waits until they are
    copied (see ``wait_copied``; any other optimizer, or none: all is copied in ``save``). Rank 0
    keeps that copy between saves and reuses it (memory: one more state on rank 0).
    ``writer_priority``: "auto" (the default: "idle" where training leaves a core free, the model on a
    GPU or fewer torch threads on the host than cores; "normal" where every core trains), "normal" (the
    write competes with training as an equal and is on disk soonest), "low" (nice 19: training's steps
    keep their time on busy CPUs, but the write takes only what they leave, so the newest checkpoint
    lags further behind a crash) or "idle" (Linux's SCHED_IDLE: the write runs only on CPU time
    training leaves, and gives a core back to a training thread at once); docs/checkpoint-format.md
    has the measurements. ``direct_io``: True writes the arrays with O_DIRECT (not through the page
    cache, where the file system allows it; the same files), False through the page cache, None (the
    default) as ``writer_priority`` chooses.

    Collective: the constructor, ``save``, ``wait`` and ``restore`` are called by every rank.
    """

    # Typed as hvdkit.tensorflow.Checkpointer (a name the adapters share takes the same arguments): model a
    # torch.nn.Module, optimizer a torch optimizer, scheduler anything with state_dict()/load_state_dict().
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
        super().__init__(
            directory,
            model,
            optimizer,
            scheduler,
            keep,
            comm or communicator(),
            seed,
            framework=f"torch {torch.__version__}",
            async_save=async_save,
            writer_priority=writer_priority,
            direct_io=direct_io,
        )
        self._staging = {}  # array name -> the host tensor an async save copies it into (rank 0)

    @staticmethod
    def _training_cpus(model):
        """``writer_priority="auto"``: whether the model is on an accelerator, torch's threads, the host's ranks."""
        tensors = [*model.parameters(), *model.buffers()] if isinstance(model, torch.nn.Module) else []
        accelerator = any(t.device.type not in ("cpu", "meta") for t in tensors)
        return accelerator, torch.get_num_threads(), topology_from_env().local_size

    def save(self, step: int, epoch: int, extra: Any = None) -> str:
        """Write a checkpoint of ``step`` (rank 0 writes; every rank's RNG state is included).

        ``epoch`` is the number of epochs completed. Returns the checkpoint path on every rank.
        ``extra`` may hold None, bool, int, float, str, bytes, lists, tuples, dicts (scalar keys)
        and tensors; anything else (a NumPy scalar or array, a path, an object of your own class),
        in ``extra`` or in a state dict, raises ConfigError on every rank naming its key path and
        type, and nothing is written. A sharded optimizer (``shard_optimizer_state=True``) is
        gathered to rank 0 first, in rounds of at most its ``chunk_elements`` elements (the other
        ranks keep none of it), and saved whole, as the unsharded optimizer's state: any world
        size, sharded or not, restores it. With ``async_save``, see ``wait``.
        Collective: every rank calls it.
        """
        self.wait()  # before anything else: every rank learns how the previous write went
        if isinstance(self.optimizer, ShardedState):  # hk.DistributedOptimizer(..., shard_optimizer_state=True)
            self.optimizer.consolidate(to=0)  # gathered first; only rank 0 calls state_dict() (in store.save's check)
        return super().save(step, epoch, extra)

    restore = CheckpointerBase.restore
    wait = CheckpointerBase.wait
    wait_copied = CheckpointerBase.wait_copied

    def _is_tensor(self, value):
        return isinstance(value, torch.Tensor)

    def _tensor_meta(self, tensor):
        if tensor.dtype in _NUMPY_DTYPES:
            return None
        return [str(tensor.dtype).removeprefix("torch."), list(tensor.shape)]  # stored as raw bytes

    def _to_array(self, tensor):
        t = tensor.detach().cpu().resolve_conj().resolve_neg()
        if t.dtype in _NUMPY_DTYPES:
            return t.numpy()
        return t.reshape(-1).view(torch.uint8).numpy()

    def _host_copies(self, items):
        """Copies of the tensors in host memory that training does not touch (rank 0, async save, all now)."""
        staging = {}
        copies = self._copy_into(items, self._staging, staging)
        self._staging = staging
        return copies

    def _stage(self, items):
        """The copies of an async save: buffers and ``extra`` now, the parameters and the optimizer state later.

        Forward and backward only read the parameters, and the optimizer state changes only in
        ``step()``; so where the optimizer is a ``torch.optim.Optimizer`` (whose ``step()`` waits for
        ``background.wait_for_copies``, as ``load_state_dict`` does) those are copied by the write
        thread while training goes on. Any other optimizer (or none): everything is copied now.
        """
        gated = self._gated_storages()
        later = [i for i, (name, t) in enumerate(items) if _gated(name, t, gated)] if gated is not None else []
        if not later:
            return self._host_copies(items), None
        old, staging, pairs = self._staging, {}, list(items)  # live tensors in ``later``'s places until copy()
        now = [i for i in range(len(items)) if i not in set(later)]
        for i, pair in zip(now, self._copy_into([items[i] for i in now], old, staging), strict=True):
            pairs[i] = pair
        self._staging = staging  # copy() fills in the rest
        ready = _cuda_ready([items[i][1] for i in later])

        def copy():
            done = self._copy_into([items[i] for i in later], old, staging, ready)
            for i, pair in zip(later, done, strict=True):
                pairs[i] = pair

        return pairs, copy

    def _gated_storages(self):
        """Rank 0: the storages of the parameters when their changes wait for an async save's copy, else None."""
        if not isinstance(self.optimizer, torch.optim.Optimizer):
            return None
        _gate_changes(self.model, self.optimizer)
        return {_storage(p) for p in self.model.parameters()}

    def _copy_into(self, items, old, staging, ready=None):
        """``(name, array)`` pairs: ``items`` copied into host tensors (reusing ``old``'s), kept in ``staging``.

        A host tensor kept from the previous save is reused when its shape and dtype match (the previous
        write is finished by then); CUDA tensors are copied without blocking into pinned memory, then
        waited for once; from the write thread (``ready``: an event recorded where the save was made),
        on a stream of their own that waits for that event. Without CUDA this is a plain copy.
        """
        copies, on_gpu = [], False
        stream = torch.cuda.Stream(ready[1]) if ready is not None else None
        if stream is not None:
            stream.wait_event(ready[0])
        with torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext():
            for name, t in items:
                if not isinstance(t, torch.Tensor):
                    copies.append((name, t))
                    continue
                t = t.detach()
                host = old.get(name)
                if host is None or host.shape != t.shape or host.dtype != t.dtype:
                    pin = t.is_cuda and torch.cuda.is_available()
                    host = torch.empty(t.shape, dtype=t.dtype, device="cpu", pin_memory=pin)
                host.copy_(t, non_blocking=t.is_cuda)  # also resolves conjugate and negative views
                on_gpu = on_gpu or t.is_cuda
                staging[name] = host
                copies.append((name, host))
        if on_gpu:
            stream.synchronize() if stream is not None else torch.cuda.synchronize()
        return [(name, t if isinstance(t, np.ndarray) else self._to_array(t)) for name, t in copies]

    def _from_array(self, array, meta, name):
        tensor = torch.from_numpy(array)
        if meta is None:
            return tensor
        dtype, shape = meta
        return tensor.view(getattr(torch, dtype)).reshape(shape)

    def _state(self):
        model = self.model.state_dict()
        return {
            "model": model,
            "model_metadata": getattr(model, "_metadata", None),  # module versions load_state_dict reads
            "optimizer": self.optimizer.state_dict() if self.optimizer is not None else None,
        }

    def _apply(self, snapshot):
        state = snapshot.state
        model = dict(state["model"])
        if state.get("model_metadata") is not None:
            model = _with_metadata(model, state["model_metadata"])
        try:
            self.model.load_state_dict(model)
            if self.optimizer is not None and state["optimizer"] is not None:
                self.optimizer.load_state_dict(state["optimizer"])
        except (RuntimeError, ValueError, KeyError) as e:
            raise CheckpointError(
                f"checkpoint {snapshot.path} does not fit this model/optimizer ({str(e).splitlines()[0]}); "
                "point --checkpoint-dir at the checkpoints of this model, or at an empty directory"
            ) from e

    def _share(self):
        share_state(self.comm, self.model, self.optimizer, error=CheckpointError)

    def _framework_rng(self):
        return {"torch": torch.get_rng_state().numpy()}

    def _set_framework_rng(self, state):
        torch.set_rng_state(torch.from_numpy(np.array(state["torch"], dtype=np.uint8)))

    def _reseed_framework(self, value):
        torch.manual_seed(value)  # with the value Python and NumPy were seeded with (see ``reseed``)

    def _read_legacy(self, folder, manifest):
        """A checkpoint of hvdkit before the shared layout: ``state.pt`` holds everything."""
        path = os.path.join(folder, LEGACY_STATE_FILE)
        if LEGACY_STATE_FILE not in manifest.get("files", {}):
            raise CheckpointError(f"{folder} holds no torch checkpoint (framework: {manifest.get('framework')!r})")
        try:
            state = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        except RuntimeError as e:
            if "mmap" not in str(e):  # only a file in torch's legacy format cannot be mapped
                raise
            state = torch.load(path, map_location="cpu", weights_only=True)
        trees = {k: state.get(k) for k in ("model", "optimizer", "scheduler")}
        rng = [_legacy_rng(r) for r in state["rng"]]
        return Snapshot(
            manifest["step"], manifest["epoch"], manifest["world_size"], state.get("extra"), trees, rng, folder
        )


_STEPS_GATED = False  # the process-wide optimizer step pre-hook is registered
_LOADS_GATED: weakref.WeakSet = weakref.WeakSet()  # models and optimizers whose load_state_dict waits


def _wait_for_copies(*_):
    wait_for_copies()


def _gate_changes(model, optimizer):
    """Make what changes a saved state in place wait for an async save's copy: every torch optimizer's
    ``step()`` (also an inner one, as a sharded optimizer's ``amp_step`` calls), and ``load_state_dict``
    of ``model`` and ``optimizer``. Registered once (process, object); a cheap check when nothing copies."""
    global _STEPS_GATED
    if not _STEPS_GATED:
        register_optimizer_step_pre_hook(_wait_for_copies)
        _STEPS_GATED = True
    for obj in (model, optimizer):
        if obj not in _LOADS_GATED and hasattr(obj, "register_load_state_dict_pre_hook"):
            obj.register_load_state_dict_pre_hook(_wait_for_copies)
            _LOADS_GATED.add(obj)


def _storage(t):
    """A key of the memory ``t`` lives in (views of one storage share it); None where it has none."""
    try:
        return t.device, t.untyped_storage().data_ptr()
    except (RuntimeError, NotImplementedError):  # a sparse or meta tensor: copied with the rest, now
        return None


def _gated(name, t, parameters):
    """Whether an async save may copy ``t`` after ``save()`` returned: a parameter or the optimizer's state."""
    if not isinstance(t, torch.Tensor):
        return False
    key = _storage(t)
    return key is not None and (name.startswith("optimizer/") or key in parameters)


def _cuda_ready(tensors):
    """An event recorded now on the current stream of the CUDA device of ``tensors``, and the device; or None.

    The write thread's copy waits for it: the kernels queued so far (the step before the save) wrote them.
    One CUDA device per process (hvdkit places a rank on one).
    """
    device = next((t.device for t in tensors if t.is_cuda), None)
    if device is None:
        return None
    event = torch.cuda.Event()
    event.record(torch.cuda.current_stream(device))
    return event, device


def _with_metadata(model, metadata):
    state = OrderedDict(model)
    state._metadata = OrderedDict(metadata)
    return state


def _legacy_rng(r):
    version, internal, gauss = r["python"]
    name, keys, *rest = r["numpy"]
    return {
        "python": [version, np.array(internal, dtype=np.uint32), gauss],
        "numpy": [name, keys.numpy().astype(np.uint32), *rest],
        "framework": {"torch": r["torch"].numpy()},
    }
