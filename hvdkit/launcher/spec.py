"""What a user asks to run: a typed, validated job description."""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from ..core.errors import ConfigError
from .hosts import Host, check_slots
from .timeline_flags import timeline_path

__all__ = ["JobSpec", "CONTROLLERS", "parse_env_vars"]

CONTROLLERS = ("mpi", "gloo")
_PYTHONS = ("python", "python3")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


@dataclass(frozen=True)
class JobSpec:
    """A job: ``num_proc`` copies of ``command`` started by mpirun (``mpi``) or horovodrun (``gloo``).

    ``hosts`` (a tuple of ``Host``) says where the ranks run; empty means this machine only.
    """

    command: tuple
    num_proc: int
    controller: str = "mpi"
    env: dict = field(default_factory=dict)  # extra variables for every rank
    mpi_args: tuple = ()  # passed to mpirun as they are
    hosts: tuple = ()  # Host(name, slots) each; () = localhost
    network_interface: str | None = None  # NIC the ranks talk over, e.g. eth0 (default: the launcher picks)
    timeline: str | None = None  # Horovod timeline file rank 0 writes (HOROVOD_TIMELINE); made absolute
    timeline_mark_cycles: bool = False  # also mark each Horovod cycle in it (HOROVOD_TIMELINE_MARK_CYCLES)

    def __post_init__(self) -> None:
        object.__setattr__(self, "command", tuple(self.command))
        object.__setattr__(self, "hosts", tuple(self.hosts))
        if isinstance(self.num_proc, bool) or not isinstance(self.num_proc, int) or self.num_proc < 1:
            raise ConfigError(f"-np must be an integer >= 1 (got {self.num_proc!r}): the number of processes to start")
        if self.controller not in CONTROLLERS:
            raise ConfigError(f"controller must be one of {CONTROLLERS} (got {self.controller!r})")
        if not self.command:
            raise ConfigError("no command given; put it after '--', e.g. hvdkit run -np 2 -- python train.py")
        _check_no_nul(self)
        nic = self.network_interface
        if nic is not None and not (isinstance(nic, str) and nic and all(c.isalnum() or c in "._-@:" for c in nic)):
            raise ConfigError(f"--network-interface must name one interface, e.g. eth0 (got {nic!r})")
        if self.timeline is not None:
            object.__setattr__(self, "timeline", timeline_path(self.timeline))
        elif self.timeline_mark_cycles:
            raise ConfigError("--timeline-mark-cycles needs --timeline FILE, the timeline to mark the cycles in")
        bad = [h for h in self.hosts if not isinstance(h, Host)]
        if bad:
            raise ConfigError(f"hosts must be Host(name, slots) values (got {bad[0]!r}); see hvdkit.launcher.hosts")
        check_slots(self.hosts, self.num_proc)


def _check_no_nul(spec: JobSpec) -> None:
    """Raise ConfigError for a command word or variable that is not text or holds NUL (no process can get it)."""
    words = [("command word", w) for w in spec.command] + [("mpi argument", w) for w in spec.mpi_args]
    words += [(f"-x {name}", value) for name, value in spec.env.items()] + [("-x name", n) for n in spec.env]
    for what, word in words:
        if not isinstance(word, str) or "\0" in word:
            raise ConfigError(f"{what} {word!r} must be text without NUL characters; no process can receive it")


def check_command(command: Sequence[str], cwd: str | None = None) -> None:
    """Raise ConfigError when ``command`` cannot start: unknown program or missing script.

    Catches the common mistakes before any process is started on any rank.
    """
    cwd = cwd or os.getcwd()
    program = command[0]
    if os.sep in program:
        if not os.access(os.path.join(cwd, program), os.X_OK):
            raise ConfigError(f"program {program!r} does not exist or is not executable")
    elif shutil.which(program) is None:
        raise ConfigError(f"program {program!r} is not on PATH; give its full path or activate the virtualenv")
    base = os.path.basename(program)
    if base.startswith(_PYTHONS) and len(command) > 1:
        script = _python_script(command[1:])
        if script is not None and not os.path.isfile(os.path.join(cwd, script)):
            raise ConfigError(
                f"script {script!r} not found (looked in {cwd}); check the path, it is relative to where you run hvdkit"
            )


def _python_script(args: Iterable[str]) -> str | None:
    """The script a python command line would run, or None (-m, -c, or only options)."""
    it = iter(args)
    for arg in it:
        if arg in ("-m", "-c", "-"):
            return None
        if arg in ("-W", "-X"):
            next(it, None)
            continue
        if arg.startswith("-"):
            continue
        return arg
    return None


def parse_env_vars(items: Iterable[str], environ: Mapping[str, str]) -> dict[str, str]:
    """``{NAME: VALUE}`` from ``-x`` arguments: ``NAME=VALUE``, or ``NAME`` for its value in ``environ``.

    Like mpirun's ``-x``: a bare NAME passes the launcher's own value, which must be set.
    """
    env = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not _ENV_NAME.fullmatch(name):
            raise ConfigError(
                f"-x needs NAME or NAME=VALUE with NAME made of letters, digits and '_' (got {item!r}); "
                "e.g. -x HVDKIT_NUM_THREADS=1"
            )
        if not sep:
            if name not in environ:
                raise ConfigError(f"-x {name}: {name} is not set in this shell; give a value: -x {name}=VALUE")
            value = environ[name]
        env[name] = value
    return env
