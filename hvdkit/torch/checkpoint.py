"""Rank-0 checkpoints of a torch training run, with automatic resume."""

import os
import random

import numpy as np
import torch

from ..core.checkpoint import CheckpointStore, Resumed
from ..core.errors import CheckpointError
from ..core.log import get_logger
from ..core.sample_order import rank_seed
from .runtime import communicator
from .safe_load import check_loadable
from .state import describe_state, receive_state

__all__ = ["Checkpointer", "Resumed"]

STATE_FILE = "state.pt"
_log = get_logger("checkpoint")


def _rng_state():
    np_state = np.random.get_state()
    return {
        "torch": torch.get_rng_state(),
        "python": random.getstate(),
        "numpy": (np_state[0], torch.from_numpy(np_state[1].astype(np.int64)), *np_state[2:]),
    }


def reseed(seed, step, rank):
    """Seed torch, Python's ``random`` and NumPy's global RNGs from ``(seed, step, rank)`` alone.

    Used at a resume with another world size, where the saved per-rank states cannot carry over
    (``hvdkit.core.sample_order.rank_seed``). Returns the seed used.
    """
    value = rank_seed(seed, step, rank)
    torch.manual_seed(value)
    random.seed(value)
    np.random.seed(value & 0xFFFFFFFF)
    return value


def _set_rng_state(state):
    torch.set_rng_state(state["torch"])
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    name, keys, *rest = state["numpy"]
    np.random.set_state((name, keys.numpy().astype(np.uint32), *rest))


class Checkpointer:
    """Saves and restores model, optimizer, LR scheduler, step, epoch, RNG states and ``extra``.

    Files go under ``directory`` through the core's rank-0 protocol (atomic, verified, newest
    ``keep`` kept). ``seed`` re-seeds the RNGs when a checkpoint is restored at another world size
    (see ``restore``). ``extra`` must hold plain data (numbers, strings, lists, dicts, tensors):
    checkpoints are read with ``torch.load(weights_only=True)``, which runs no pickled code.

    Collective: the constructor, ``save`` and ``restore`` are called by every rank.
    """

    def __init__(self, directory, model, optimizer=None, scheduler=None, keep=3, comm=None, seed=0):
        self.comm = comm or communicator()
        self.seed = seed
        self.model = model
        self.optimizer = optimizer
        self.scheduler = scheduler
        self.store = CheckpointStore(directory, self.comm, keep=keep, framework=f"torch {torch.__version__}")

    def save(self, step, epoch, extra=None):
        """Write a checkpoint of ``step`` (rank 0 writes; every rank's RNG state is included).

        ``epoch`` is the number of epochs completed. Returns the checkpoint path. A value that
        ``torch.load(weights_only=True)`` would refuse at resume (a NumPy scalar or array, a
        ``pathlib.Path``, an instance of your own class), in ``extra`` or in a state dict, raises
        ConfigError on every rank naming its key path and type, and nothing is written.
        Collective: every rank calls it.
        """
        rngs = self.comm.allgather_object(_rng_state(), name="hvdkit.checkpoint.rng")

        def state():
            return {
                "model": self.model.state_dict(),
                "optimizer": self.optimizer.state_dict() if self.optimizer is not None else None,
                "scheduler": self.scheduler.state_dict() if self.scheduler is not None else None,
                "step": int(step),
                "epoch": int(epoch),
                "rng": rngs,
                "extra": extra,
            }

        def check():  # rank 0, before anything is written
            for key, value in state().items():
                check_loadable(value, key)

        def write(folder):
            torch.save(state(), os.path.join(folder, STATE_FILE))

        return self.store.save(write, step, epoch, check=check)

    def restore(self):
        """Load the newest good checkpoint into the model, optimizer and scheduler on every rank.

        Returns a ``Resumed`` or None when there is no checkpoint. Every rank ends with rank 0's
        parameters and optimizer state, and its own RNG state when the world size is unchanged.
        At another world size the saved per-rank RNG states cannot carry over: every rank re-seeds
        torch, ``random`` and NumPy from ``(seed, step, rank)`` (``reseed``), logged on rank 0.
        A checkpoint that does not fit the model raises CheckpointError and is left untouched.
        Rank 0 maps the file into memory and loads it into its own model and optimizer; the other
        ranks receive rank 0's tensors in bounded chunks straight into their parameters and
        buffers (the path ``broadcast_state`` takes): no rank holds a pickled copy of the state.
        Collective: every rank calls it.
        """
        kept = {}

        def describe(state, info):  # rank 0; what it raises fails every rank
            self._apply(state, info.path)
            rest = {k: state.get(k) for k in ("scheduler", "step", "epoch", "rng", "extra")}
            header, kept["tensors"] = describe_state(self.model, self.optimizer, rest)
            return header

        loaded = self.store.load_on_rank0(_read_state, describe)
        if loaded is None:
            return None
        _, header, info = loaded
        rest = receive_state(self.comm, header, kept.get("tensors"), self.model, self.optimizer, error=CheckpointError)
        if not self.comm.is_rank0 and self.scheduler is not None and rest["scheduler"] is not None:
            self.scheduler.load_state_dict(rest["scheduler"])
        rngs = rest["rng"]
        if len(rngs) == self.comm.size:
            _set_rng_state(rngs[self.comm.rank])
        else:
            reseed(self.seed, rest["step"], self.comm.rank)
            if self.comm.is_rank0:
                _log.warning(
                    "checkpoint was written by %d ranks, this job has %d: data is re-sharded by global sample "
                    "offset, RNG states re-seeded from (seed %d, step %d, rank)",
                    len(rngs),
                    self.comm.size,
                    self.seed,
                    rest["step"],
                )
        if self.comm.is_rank0:
            _log.info("resumed from %s (step %d, epoch %d)", info.path, info.step, info.epoch)
        return Resumed(rest["step"], rest["epoch"], rest["extra"], info.path, info.world_size)

    def _apply(self, state, path):
        """Load ``state`` into this rank's model, optimizer and scheduler, or CheckpointError."""
        try:
            self.model.load_state_dict(state["model"])
            if self.optimizer is not None and state["optimizer"] is not None:
                self.optimizer.load_state_dict(state["optimizer"])
            if self.scheduler is not None and state["scheduler"] is not None:
                self.scheduler.load_state_dict(state["scheduler"])
        except (RuntimeError, ValueError, KeyError) as e:
            raise CheckpointError(
                f"checkpoint {path} does not fit this model/optimizer ({str(e).splitlines()[0]}); "
                "point --checkpoint-dir at the checkpoints of this model, or at an empty directory"
            ) from e


def _read_state(folder):
    """The state in ``folder``, memory-mapped: the tensors are read from the file as they are used."""
    path = os.path.join(folder, STATE_FILE)
    try:
        return torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except RuntimeError as e:
        if "mmap" not in str(e):  # only a file in torch's legacy format cannot be mapped
            raise
        return torch.load(path, map_location="cpu", weights_only=True)
