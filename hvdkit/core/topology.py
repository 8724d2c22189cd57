"""Where this process sits in the job: rank, size, local rank, local size."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from . import env as _env
from .errors import ConfigError

__all__ = ["Topology", "from_env"]


@dataclass(frozen=True)
class Topology:
    """Position of one process in a job of ``size`` processes."""

    rank: int = 0
    size: int = 1
    local_rank: int = 0
    local_size: int = 1

    def __post_init__(self):
        if self.size < 1 or not 0 <= self.rank < self.size:
            raise ConfigError(f"rank must be in [0, size) with size >= 1 (got rank={self.rank}, size={self.size})")
        if self.local_size < 1 or not 0 <= self.local_rank < self.local_size:
            raise ConfigError(
                "local_rank must be in [0, local_size) "
                f"(got local_rank={self.local_rank}, local_size={self.local_size})"
            )

    @property
    def is_rank0(self) -> bool:
        return self.rank == 0

    def __str__(self):
        return f"rank {self.rank}/{self.size} (local {self.local_rank}/{self.local_size})"


def _int(environ, name):
    raw = environ[name]
    try:
        return int(raw.split("(")[0].split(",")[0])  # SLURM writes "2(x3)" or "2,1" per node
    except ValueError:
        raise ConfigError(f"{name} must be an integer (got {raw!r}); the launcher set it wrong") from None


def from_env(environ: Mapping[str, str] | None = None) -> Topology:
    """Topology from the variables of horovodrun, Open MPI, MPICH or SLURM; one process if none.

    Env: HOROVOD_*, OMPI_COMM_WORLD_*, PMI_*/MPI_LOCAL*, SLURM_* (first complete set wins).
    """
    environ = os.environ if environ is None else environ
    for rank, size, local_rank, local_size in _env.RANK_VARIABLES:
        if rank in environ and size in environ:
            r, s = _int(environ, rank), _int(environ, size)
            lr = _int(environ, local_rank) if local_rank in environ else 0
            ls = _int(environ, local_size) if local_size in environ else 1
            if lr >= ls:  # partial information (e.g. no local size): assume one process per host
                lr, ls = 0, 1
            return Topology(r, s, lr, ls)
    return Topology()
