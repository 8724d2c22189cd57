"""Every environment variable hvdkit reads or sets, named in one place.

Precedence everywhere: a CLI flag or explicit argument > an ``HVDKIT_*`` variable > the default.
Read a variable only through the typed readers here (``read`` with a ``Kind``: ``integer``, ``number``,
``SECONDS``, ``choice``; ``read_int``, ``read_float``, ``read_choice``, ``seconds``, ``flag``,
``num_threads``); a CLI option with a variable uses the ``FromEnv`` argparse action and ``resolve``.
A bad value is a ConfigError naming the variable, its text and the fix.
"""

from __future__ import annotations

import argparse
import math
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from .errors import ConfigError
from .options import COMPRESSION_MODES, check_positive_int

# Read by hvdkit.
LOG_LEVEL = "HVDKIT_LOG_LEVEL"  # DEBUG, INFO (default), WARNING, ERROR
PROGRESS = "HVDKIT_PROGRESS"  # "auto" (default: on when stderr is a terminal), "1"/"on", "0"/"off"
PROGRESS_INTERVAL = "HVDKIT_PROGRESS_INTERVAL"  # seconds between progress lines when not a terminal (default 10)
NUM_THREADS = "HVDKIT_NUM_THREADS"  # intra-op threads per rank (default: cores / local size)
STALL_TIMEOUT = "HVDKIT_STALL_TIMEOUT"  # seconds a rank may stay out of a collective (default 600)
GRACE_PERIOD = "HVDKIT_GRACE_PERIOD"  # seconds ranks get to checkpoint after SIGTERM (default 30)
MAX_RESTARTS = "HVDKIT_MAX_RESTARTS"  # `hvdkit run` relaunches after a failure (default 0; elastic jobs 10)
DISCOVERY_INTERVAL = "HVDKIT_DISCOVERY_INTERVAL"  # seconds between host discovery polls of an elastic job (default 5)
ELASTIC_TIMEOUT = "HVDKIT_ELASTIC_TIMEOUT"  # seconds an elastic job waits for --min-np slots (default 600)
SLOTS_PER_HOST = "HVDKIT_SLOTS_PER_HOST"  # slots of a host a discovery script lists bare (default: Open MPI's, else 1)
STRAGGLER_THRESHOLD = "HVDKIT_STRAGGLER_THRESHOLD"  # slowdown above which a rank is a straggler (default 1.2)
COMPRESSION = "HVDKIT_COMPRESSION"  # none, fp16 or auto: what compression="auto" becomes (default: measure)

# Set by `hvdkit run` for the ranks it starts.
JOB_ID = "HVDKIT_JOB_ID"  # random per launch: each rank's wrapper tags its reports (pid, how it ended) with it
RESTART = "HVDKIT_RESTART"  # 0 for the first launch, k for the k-th restart (elastic: k-th relaunch, any cause)
WORLD_SIZE = "HVDKIT_WORLD_SIZE"  # the ranks of this launch (an elastic job's size changes between launches)
RECOVERY = "HVDKIT_RECOVERY"  # "in-process": started by hvdkit run --recovery in-process (Horovod's elastic driver)
MEMBERSHIP_CHANGES = "HVDKIT_MEMBERSHIP_CHANGES"  # elastic: times the hosts or the size changed so far (0 at first)
LINEAGE = "HVDKIT_LINEAGE"  # elastic: one random id for every attempt of the job (its checkpoint lock names it)

# Set by `hvdkit tune` for the `hvdkit run` of each trial (and so for its ranks).
TUNE_REPORT = "HVDKIT_TUNE_REPORT"  # file rank 0's hvdkit.tune.report() appends one JSON line per epoch to
TUNE_TRIAL = "HVDKIT_TUNE_TRIAL"  # the trial's number in its study

# MLflow's own, used by hvdkit.core.monitoring.tracking: the first is read (an explicit URI wins), the second
# set to "true" (if unset) when the URI is a `file:` store, which MLflow 3 refuses otherwise.
MLFLOW_TRACKING_URI = "MLFLOW_TRACKING_URI"
MLFLOW_ALLOW_FILE_STORE = "MLFLOW_ALLOW_FILE_STORE"

# Open MPI's default slots per host; the MPI Operator sets it to slotsPerWorker on the launcher, whose
# discover_hosts.sh lists bare worker names. hvdkit reads it as the slots of a bare discovered host.
OMPI_DEFAULT_SLOTS = "OMPI_MCA_orte_set_default_slots"

# Horovod's own stall inspector, which hvdkit configures from STALL_TIMEOUT unless these are set.
HOROVOD_STALL_CHECK = "HOROVOD_STALL_CHECK_TIME_SECONDS"
HOROVOD_STALL_SHUTDOWN = "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS"
# Horovod's timeline, which `hvdkit run --timeline FILE` sets for every rank (only rank 0 writes it).
HOROVOD_TIMELINE = "HOROVOD_TIMELINE"
HOROVOD_TIMELINE_MARK_CYCLES = "HOROVOD_TIMELINE_MARK_CYCLES"  # "1": a CYCLE_START record per Horovod cycle
# Horovod's engine settings, which hvdkit sets (hvdkit.core.horovod_settings) unless these are set.
HOROVOD_CYCLE_TIME = "HOROVOD_CYCLE_TIME"  # ms between the background thread's negotiation rounds (fractions too)
HOROVOD_CACHE_CAPACITY = "HOROVOD_CACHE_CAPACITY"  # responses cached (0: off)
HOROVOD_FUSION_THRESHOLD = "HOROVOD_FUSION_THRESHOLD"  # bytes of one fusion buffer
HOROVOD_GLOO_RENDEZVOUS_ADDR = "HOROVOD_GLOO_RENDEZVOUS_ADDR"  # set by horovodrun --gloo: the job runs over Gloo
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

DEFAULT_MAX_RESTARTS = 0
COMPRESSION_CHOICES = COMPRESSION_MODES
DEFAULT_LOG_LEVEL = "INFO"
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
OMP_NUM_THREADS = "OMP_NUM_THREADS"  # OpenMP's own; hvdkit reads it after NUM_THREADS

_TRUE = {"1", "on", "true", "yes"}
_FALSE = {"0", "off", "false", "no"}


class Kind:
    """How to read one setting from text: ``parse(text)`` gives the value or raises ValueError.

    ``what`` completes "NAME must be ..." in the error.
    """

    def __init__(self, parse: Callable[[str], Any], what: str) -> None:
        self.parse = parse
        self.what = what


def integer(minimum: int = 0) -> Kind:
    """The Kind of an integer >= ``minimum``."""

    def parse(text):
        value = int(text)
        if value < minimum:
            raise ValueError(value)
        return value

    return Kind(parse, f"an integer >= {minimum}")


def number(above: float = 0.0, what: str | None = None) -> Kind:
    """The Kind of a finite number > ``above``."""

    def parse(text):
        value = float(text)
        if not math.isfinite(value) or value <= above:
            raise ValueError(value)
        return value

    return Kind(parse, what or f"a finite number > {above:g}")


def choice(choices: Sequence[str], upper: bool = False) -> Kind:
    """The Kind of one of ``choices`` (compared in upper case when ``upper``)."""

    def parse(text):
        value = text.upper() if upper else text
        if value not in choices:
            raise ValueError(value)
        return value

    return Kind(parse, f"one of {', '.join(choices)}")


SECONDS = number(0.0, "a positive number of seconds")
POSITIVE_INT = integer(1)


def _raw(name, environ):
    return (environ if environ is not None else os.environ).get(name, "").strip()


def read(name: str, kind: Kind, default: Any = None, environ: Mapping[str, str] | None = None) -> Any:
    """The value of variable ``name`` read as ``kind``, or ``default`` when it is unset or empty.

    Raises ConfigError naming the variable, its text and the fix.
    """
    raw = _raw(name, environ)
    if not raw:
        return default
    try:
        return kind.parse(raw)
    except ValueError:
        raise ConfigError(f"{name} must be {kind.what} (got {raw!r}); fix or unset it") from None


def read_int(name: str, default: Any, minimum: int = 0, environ: Mapping[str, str] | None = None) -> Any:
    """An integer >= ``minimum`` from variable ``name``, or ``default`` when unset."""
    return read(name, integer(minimum), default, environ)


def read_float(name: str, default: Any, above: float = 0.0, environ: Mapping[str, str] | None = None) -> Any:
    """A finite number > ``above`` from variable ``name``, or ``default`` when unset."""
    return read(name, number(above), default, environ)


def read_choice(
    name: str, choices: Sequence[str], default: Any, upper: bool = False, environ: Mapping[str, str] | None = None
) -> Any:
    """One of ``choices`` from variable ``name``, or ``default`` when unset."""
    return read(name, choice(choices, upper), default, environ)


def seconds(name: str, default: Any, environ: Mapping[str, str] | None = None) -> Any:
    """A positive number of seconds from variable ``name``, or ``default`` when unset."""
    return read(name, SECONDS, default, environ)


def flag(name: str, default: bool | None = None, environ: Mapping[str, str] | None = None) -> bool | None:
    """Read a boolean variable: True, False, or ``default`` when unset or "auto".

    Raises ConfigError for any other value.
    """
    raw = _raw(name, environ).lower()
    if raw in ("", "auto"):
        return default
    if raw in _TRUE:
        return True
    if raw in _FALSE:
        return False
    raise ConfigError(f"{name} must be one of 1/on, 0/off or auto (got {raw!r}); fix or unset it")


def num_threads(
    threads: int | None = None, local_size: int = 1, cores: int | None = None, environ: Mapping[str, str] | None = None
) -> int:
    """Intra-op threads per rank: ``threads``, else HVDKIT_NUM_THREADS, else OMP_NUM_THREADS, else
    cores / ``local_size`` (at least 1), so ranks sharing a host do not oversubscribe it.

    The one rule for every framework. OMP_NUM_THREADS may be an OpenMP list ("4,2"): its first
    entry counts.
    Env: HVDKIT_NUM_THREADS, OMP_NUM_THREADS.
    """
    if threads is not None:
        return check_positive_int("threads", threads)
    n = read(NUM_THREADS, POSITIVE_INT, None, environ)
    if n is None:
        omp = _raw(OMP_NUM_THREADS, environ).split(",")[0].strip()
        n = read(OMP_NUM_THREADS, POSITIVE_INT, None, {OMP_NUM_THREADS: omp})
    if n is None:
        cores = len(os.sched_getaffinity(0)) if cores is None else cores
        n = max(1, cores // max(1, local_size))
    return n


class FromEnv(argparse.Action):
    """argparse action for an option with a variable: the flag wins, then the variable, then ``default``.

        p.add_argument("--max-restarts", action=FromEnv, env_var=MAX_RESTARTS, kind=integer(0), default=0)

    Values are read and checked by ``resolve(args)`` after parsing (so a bad variable is no error when
    the flag is given): ConfigError names the flag or the variable and its value.
    """

    def __init__(
        self, option_strings: Sequence[str], dest: str, env_var: str, kind: Kind, default: Any = None, **kwargs: Any
    ) -> None:
        super().__init__(option_strings, dest, default=_Pending(env_var, None, kind, default), **kwargs)

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        setattr(namespace, self.dest, _Pending(option_string, values, self.default.kind, None))


class _Pending:
    """An option's value not read yet: the flag's text (``text`` not None) or the variable ``source``."""

    def __init__(self, source, text, kind, default):
        self.source, self.text, self.kind, self.default = source, text, kind, default

    def value(self):
        if self.text is None:
            return read(self.source, self.kind, self.default)
        try:
            return self.kind.parse(self.text.strip())
        except ValueError as e:
            got = e.args[0] if e.args and not isinstance(e.args[0], str) else self.text
            raise ConfigError(f"{self.source} must be {self.kind.what} (got {got!r})") from None


def given(value: Any) -> bool:
    """True when a ``FromEnv`` option (before ``resolve``) came from its flag or its variable, not its default."""
    return not isinstance(value, _Pending) or value.text is not None or bool(_raw(value.source, None))


def resolve(args: argparse.Namespace) -> argparse.Namespace:
    """Replace every ``FromEnv`` option of the parsed ``args`` by its value (flag > variable > default)."""
    for dest, value in vars(args).items():
        if isinstance(value, _Pending):
            setattr(args, dest, value.value())
    return args


def discovered_host_slots(given: int | None = None, environ: Mapping[str, str] | None = None) -> int:
    """The slots of a host a discovery script lists without ``:slots``: ``given`` (``--slots-per-host``
    or HVDKIT_SLOTS_PER_HOST), else Open MPI's OMPI_MCA_orte_set_default_slots when it is a count
    (the MPI Operator sets it to ``slotsPerWorker``), else 1.
    Env: OMPI_MCA_orte_set_default_slots.
    """
    if given is not None:
        return given
    try:
        return read(OMPI_DEFAULT_SLOTS, POSITIVE_INT, 1, environ)
    except ConfigError:  # Open MPI's other values ("cores", "sockets", ...) count nothing hvdkit can use
        return 1


def stall_settings(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The Horovod stall-inspector variables hvdkit sets: ``{name: value}`` for those not set already.

    A rank missing from a collective for HVDKIT_STALL_TIMEOUT seconds (default 600) makes Horovod
    shut down with an error naming it, instead of every other rank waiting forever. Horovod's own
    default only warns. Horovod reads whole seconds and takes 0 as "never": a fraction is rounded
    up. The check time (how often Horovod looks) is derived from the shutdown time in force, the
    user's or hvdkit's: Horovod never shuts down when it is above the shutdown time. Variables
    the user set win; a pair of them that disables the shutdown raises ConfigError.
    Env: HVDKIT_STALL_TIMEOUT, HOROVOD_STALL_SHUTDOWN_TIME_SECONDS, HOROVOD_STALL_CHECK_TIME_SECONDS.
    """
    environ = os.environ if environ is None else environ
    timeout = math.ceil(seconds(STALL_TIMEOUT, DEFAULT_STALL_TIMEOUT, environ))
    shutdown = read(HOROVOD_STALL_SHUTDOWN, integer(0), timeout, environ)
    check = read(HOROVOD_STALL_CHECK, integer(0), None, environ)
    if check is not None and shutdown > 0 and check > shutdown:
        raise ConfigError(
            f"{HOROVOD_STALL_CHECK}={check} is above the stall shutdown time of {shutdown} s: Horovod would then "
            f"never shut a stalled job down; unset {HOROVOD_STALL_CHECK} (hvdkit derives it from the shutdown "
            f"time) or set it to {shutdown} or less"
        )
    wanted = {HOROVOD_STALL_SHUTDOWN: str(shutdown), HOROVOD_STALL_CHECK: str(min(60, max(1, shutdown // 3)))}
    return {k: v for k, v in wanted.items() if k not in environ}
