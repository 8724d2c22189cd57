"""Every environment variable hvdkit reads or sets, named in one place.

Precedence everywhere: a CLI flag or explicit argument > an ``HVDKIT_*`` variable > the default.
"""

import os

# Read by hvdkit.
LOG_LEVEL = "HVDKIT_LOG_LEVEL"  # DEBUG, INFO (default), WARNING, ERROR
PROGRESS = "HVDKIT_PROGRESS"  # "auto" (default: on when stderr is a terminal), "1"/"on", "0"/"off"
NUM_THREADS = "HVDKIT_NUM_THREADS"  # intra-op threads per rank (default: cores / local size)

# Set by `hvdkit run` for the ranks it starts.
STATUS_DIR = "HVDKIT_STATUS_DIR"  # where each rank's wrapper records how it ended

# Rank variables set by the launchers hvdkit supports, in order of preference.
# (rank, size, local rank, local size)
RANK_VARIABLES = (
    ("HOROVOD_RANK", "HOROVOD_SIZE", "HOROVOD_LOCAL_RANK", "HOROVOD_LOCAL_SIZE"),  # horovodrun
    (
        "OMPI_COMM_WORLD_RANK",
        "OMPI_COMM_WORLD_SIZE",
        "OMPI_COMM_WORLD_LOCAL_RANK",
        "OMPI_COMM_WORLD_LOCAL_SIZE",
    ),  # Open MPI's mpirun
    ("PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"),  # MPICH / Intel MPI
    ("SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE"),  # srun
)

_TRUE = {"1", "on", "true", "yes"}
_FALSE = {"0", "off", "false", "no"}


def flag(name, default=None, environ=None):
    """Read a boolean variable: True, False, or ``default`` when unset or "auto".

    Raises ConfigError for any other value.
    """
    from .errors import ConfigError

    raw = (environ if environ is not None else os.environ).get(name, "").strip().lower()
    if raw in ("", "auto"):
        return default
    if raw in _TRUE:
        return True
    if raw in _FALSE:
        return False
    raise ConfigError(f"{name} must be one of 1/on, 0/off or auto (got {raw!r}); fix or unset it")
