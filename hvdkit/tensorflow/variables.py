"""Making every rank start from rank 0's variables."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from ..core.errors import CollectiveError
from ._engine import horovod_tf
from .runtime import communicator

__all__ = ["broadcast_variables"]


def _signature(variables):
    return [(str(getattr(v, "path", None) or v.name), tuple(v.shape), str(v.dtype)) for v in variables]


def check_same_variables(variables: Sequence[Any], what: str = "variables") -> None:
    """Raise CollectiveError on every rank unless every rank passes the same shapes and dtypes.

    Collective: every rank calls it.
    """
    comm = communicator()
    mine = [(shape, dtype) for _, shape, dtype in _signature(variables)]
    everyone = comm.allgather_object(mine, name="hvdkit.variables.signature")
    differ = [r for r, sig in enumerate(everyone) if sig != everyone[0]]
    if differ:
        raise CollectiveError(
            f"{what} differ across ranks: rank 0 has {len(everyone[0])}, "
            + ", ".join(f"rank {r} has {len(everyone[r])}" for r in differ)
            + " (or their shapes/dtypes differ); build the same model on every rank before broadcasting"
        )


def broadcast_variables(variables: Iterable[Any], root_rank: int = 0) -> None:
    """Assign ``root_rank``'s values to ``variables`` (tf or Keras 3 variables) on every rank.

    First checks that every rank passes the same number of variables with the same shapes and
    dtypes, so a mismatch is a clear error on every rank rather than a hang or a crash in the engine.
    Collective: every rank calls it with its copy of the same variables.
    """
    variables = list(variables)
    check_same_variables(variables)
    if variables:  # the engine takes Keras 3 variables as they are (engine fix 11)
        horovod_tf().broadcast_variables(variables, root_rank)
