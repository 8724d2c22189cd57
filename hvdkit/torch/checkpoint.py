"""Rank-0 checkpoints of a torch training run, with automatic resume.

The format, the RNG states of every rank, the scheduler and the order of the collectives are the
core's (``hvdkit.core.checkpoint.state``); this module only turns torch state into arrays and back.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from ..core.checkpoint.state import CheckpointerBase, Snapshot
from ..core.checkpoint.store import Resumed
from ..core.checkpoint.tree import reseed_rng
from ..core.errors import CheckpointError
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

    ``async_save=True``: ``save`` blocks only while rank 0 copies the state into host memory (CUDA
    tensors into pinned memory, one synchronization for all), then a thread writes it; see
    ``wait``. Rank 0 keeps that copy between saves and reuses it (memory: one more state on rank 0).

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
        )
        self._staging = {}  # array name -> the host tensor an async save copies it into (rank 0)

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
        """Copies of the tensors in host memory that training does not touch (rank 0, async save).

        Each goes into a host tensor kept from the previous save when its shape and dtype match
        (the previous write is finished by then); CUDA tensors are copied without blocking into
        pinned memory, then waited for once. Without CUDA this is a plain copy.
        """
        staging, copies, on_gpu = {}, [], False
        for name, t in items:
            if not isinstance(t, torch.Tensor):
                copies.append((name, t))
                continue
            t = t.detach()
            host = self._staging.get(name)
            if host is None or host.shape != t.shape or host.dtype != t.dtype:
                pin = t.is_cuda and torch.cuda.is_available()
                host = torch.empty(t.shape, dtype=t.dtype, device="cpu", pin_memory=pin)
            host.copy_(t, non_blocking=t.is_cuda)  # also resolves conjugate and negative views
            on_gpu = on_gpu or t.is_cuda
            staging[name] = host
            copies.append((name, host))
        if on_gpu:
            torch.cuda.synchronize()
        self._staging = staging
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
