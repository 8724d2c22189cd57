"""Every environment variable hvdkit reads or sets, named in one place.

Precedence everywhere: a CLI flag or explicit argument > an ``HVDKIT_*`` variable > the default.
"""

import os

# Read by hvdkit.
LOG_LEVEL = "HVDKIT_LOG_LEVEL"  # DEBUG, INFO (default), WARNING, ERROR
PROGRESS = "HVDKIT_PROGRESS"  # "auto" (default: on when stderr is a terminal), "1"/"on", "0"/"off"
PROGRESS_INTERVAL = "HVDKIT_PROGRESS_INTERVAL"  # seconds between progress lines when not a terminal (default 10)
NUM_THREADS = "HVDKIT_NUM_THREADS"  # intra-op threads per rank (default: cores / local size)
STALL_TIMEOUT = "HVDKIT_STALL_TIMEOUT"  # seconds a rank may stay out of a collective (default 600)
GRACE_PERIOD = "HVDKIT_GRACE_PERIOD"  # seconds ranks get to checkpoint after SIGTERM (default 30)
MAX_RESTARTS = "HVDKIT_MAX_RESTARTS"  # `hvdkit run` relaunches after a failure (default 0)
STRAGGLER_THRESHOLD = "HVDKIT_STRAGGLER_THRESHOLD"  # slowdown above which a rank is a straggler (default 1.2)

# Set by `hvdkit run` for the ranks it starts.
JOB_ID = "HVDKIT_JOB_ID"  # random per launch: each rank's wrapper tags its reports (pid, how it ended) with it
RESTART = "HVDKIT_RESTART"  # 0 for the first launch, k for the k-th restart

# MLflow's own, used by hvdkit.core.tracking: the first is read (an explicit URI wins), the second
# set to "true" (if unset) when the URI is a `file:` store, which MLflow 3 refuses otherwise.
MLFLOW_TRACKING_URI = "MLFLOW_TRACKING_URI"
MLFLOW_ALLOW_FILE_STORE = "MLFLOW_ALLOW_FILE_STORE"

# Horovod's own stall inspector, which hvdkit configures from STALL_TIMEOUT unless these are set.
HOROVOD_STALL_CHECK = "HOROVOD_STALL_CHECK_TIME_SECONDS"
HOROVOD_STALL_SHUTDOWN = "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS"
# Horovod's timeline, which `hvdkit run --timeline FILE` sets for every rank (only rank 0 writes it).
HOROVOD_TIMELINE = "HOROVOD_TIMELINE"
HOROVOD_TIMELINE_MARK_CYCLES = "HOROVOD_TIMELINE_MARK_CYCLES"  # "1": a CYCLE_START record per Horovod cycle
DEFAULT_STALL_TIMEOUT = 600
DEFAULT_GRACE_PERIOD = 30
DEFAULT_STRAGGLER_THRESHOLD = 1.2

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


def seconds(name, default, environ=None):
    """A positive number of seconds from variable ``name``, or ``default`` when unset."""
    from .errors import ConfigError

    raw = (environ if environ is not None else os.environ).get(name, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = -1
    if value <= 0:
        raise ConfigError(f"{name} must be a positive number of seconds (got {raw!r}); fix or unset it")
    return value


def stall_settings(environ=None):
    """The Horovod stall-inspector variables hvdkit sets: ``{name: value}`` for those not set already.

    A rank missing from a collective for HVDKIT_STALL_TIMEOUT seconds (default 600) makes Horovod
    shut down with an error naming it, instead of every other rank waiting forever. Horovod's own
    default only warns. Variables the user set win.
    """
    environ = os.environ if environ is None else environ
    timeout = int(seconds(STALL_TIMEOUT, DEFAULT_STALL_TIMEOUT, environ))
    wanted = {HOROVOD_STALL_SHUTDOWN: str(timeout), HOROVOD_STALL_CHECK: str(min(60, max(1, timeout // 3)))}
    return {k: v for k, v in wanted.items() if k not in environ}
