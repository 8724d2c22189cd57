"""Where the ranks run: hosts from -H, a hostfile, an MPI Operator pod, a SLURM allocation. Pure.

Every function takes text or an environment mapping and returns a tuple of ``Host``; nothing here
reads ``os.environ`` itself, so callers (and tests) decide which environment counts.
An empty tuple means "this machine only", the launcher's local default.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from ..core.errors import ConfigError

__all__ = [
    "Host",
    "parse_host_list",
    "parse_hostfile",
    "read_hostfile",
    "expand_nodelist",
    "expand_tasks_per_node",
    "slurm_hosts",
    "mpirun_uses_srun",
    "mpi_operator_hostfile",
    "resolve",
    "format_hosts",
    "total_slots",
    "is_local",
    "check_slots",
]

# Variables set by the schedulers hvdkit reads hosts from (not hvdkit's own, so not HVDKIT_*).
SLURM_NODELIST = "SLURM_JOB_NODELIST"  # e.g. node[01-03,07]
SLURM_NODELIST_OLD = "SLURM_NODELIST"  # older name, same value
SLURM_TASKS_PER_NODE = "SLURM_TASKS_PER_NODE"  # e.g. 2(x3),1
SLURM_JOBID = "SLURM_JOBID"  # what Open MPI's mpirun looks for to start its daemons with srun
MPI_OPERATOR_HOSTFILE_VAR = "OMPI_MCA_orte_default_hostfile"  # set by the MPI Operator on the launcher
MPI_OPERATOR_HOSTFILE = "/etc/mpi/hostfile"  # where the MPI Operator mounts it

LOCAL_NAMES = frozenset({"localhost", "127.0.0.1"})

# Whole-string matches only (fullmatch): `$` would also match before a trailing newline.
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._@-]*")
_COUNT = re.compile(r"[0-9]{1,12}")  # bounded: int() refuses strings of over 4300 digits
MAX_NODES = 100_000  # a node list or task count beyond this is a typo, not an allocation; never expand it
_H_FORMAT = "expected host:slots, e.g. node1:4 (slots default to 1: node1,node2)"
_FILE_FORMAT = "expected 'host slots=N' (Open MPI) or 'host:N' (horovodrun) per line, e.g. node1 slots=4"


@dataclass(frozen=True)
class Host:
    """A machine that runs ``slots`` ranks."""

    name: str
    slots: int = 1

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not _NAME.fullmatch(self.name):
            raise ConfigError(f"host name {self.name!r} is not a host name; {_H_FORMAT}")
        if isinstance(self.slots, bool) or not isinstance(self.slots, int) or self.slots < 1:
            raise ConfigError(f"host {self.name!r} needs slots >= 1 (got {self.slots!r}); {_H_FORMAT}")

    def __str__(self) -> str:
        return f"{self.name}:{self.slots}"


def _slots(text: str) -> int | None:
    """The slot count in ``text`` or None when it is not a whole number >= 1."""
    return int(text) if _COUNT.fullmatch(text) and int(text) >= 1 else None


def _unique(hosts: Iterable[Host], where: str) -> tuple[Host, ...]:
    seen = set()
    for host in hosts:
        if host.name in seen:
            raise ConfigError(f"host {host.name!r} is listed twice in {where}; list it once with all its slots")
        seen.add(host.name)
    return tuple(hosts)


def parse_host_list(text: str) -> tuple[Host, ...]:
    """Hosts from horovodrun/-H syntax: ``"a:2,b:2"``; a host without ``:N`` has 1 slot."""
    hosts = []
    for entry in text.split(","):
        entry = entry.strip()
        name, sep, count = entry.partition(":")
        slots = _slots(count) if sep else 1
        if not _NAME.fullmatch(name) or slots is None:
            raise ConfigError(f"bad host entry {entry!r} in -H {text!r}; {_H_FORMAT}")
        hosts.append(Host(name, slots))
    return _unique(hosts, f"-H {text!r}")


def _hostfile_line(line: str) -> Host | None:
    """``Host`` for one hostfile line without its comment, or None when it is not valid."""
    first, *options = line.split()
    name, sep, count = first.partition(":")
    slots = _slots(count) if sep else None
    if not _NAME.fullmatch(name) or (sep and slots is None):
        return None
    for option in options:
        key, eq, value = option.partition("=")
        if not eq or _slots(value) is None:
            return None
        if key == "slots" and slots is None:
            slots = int(value)
        elif key not in ("max_slots", "max-slots"):  # Open MPI's cap; the slots decide hvdkit's count
            return None
    return Host(name, slots or 1)


def parse_hostfile(text: str, source: str = "hostfile") -> tuple[Host, ...]:
    """Hosts from a hostfile: Open MPI (``node1 slots=4``) or horovodrun (``node1:4``) lines.

    ``#`` starts a comment; blank lines are skipped; a host without a count has 1 slot.
    """
    hosts = []
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        host = _hostfile_line(line)
        if host is None:
            raise ConfigError(f"{source}, line {number}: bad entry {line!r}; {_FILE_FORMAT}")
        hosts.append(host)
    if not hosts:
        raise ConfigError(f"{source} lists no hosts; {_FILE_FORMAT}")
    return _unique(hosts, source)


def read_hostfile(path: str) -> tuple[Host, ...]:
    """``parse_hostfile`` of the file at ``path``; a missing or unreadable file is a ConfigError."""
    try:
        with open(path) as f:
            text = f.read()
    except OSError as e:
        raise ConfigError(f"cannot read hostfile {path!r} ({e.strerror}); check the path") from None
    return parse_hostfile(text, source=path)


def _split_top(text: str) -> list[str]:
    """``text`` split at the commas outside brackets: ``"a[1,2],b"`` -> ``["a[1,2]", "b"]``."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        depth += ch == "["
        depth -= ch == "]"
        if ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return parts


def _expand_range_set(body: str, where: str) -> list[str]:
    """``"01-03,07"`` -> ``["01", "02", "03", "07"]``, keeping the zero padding of each start."""
    out = []
    for item in body.split(","):
        lo, dash, hi = item.partition("-")
        if not _COUNT.fullmatch(lo) or (dash and not _COUNT.fullmatch(hi)) or (dash and int(hi) < int(lo)):
            raise ConfigError(f"bad range {item!r} in SLURM node list {where!r}; expected e.g. node[01-03,07]")
        if int(hi if dash else lo) - int(lo) >= MAX_NODES:
            raise ConfigError(
                f"range {item!r} in SLURM node list {where!r} names more than {MAX_NODES} nodes; check "
                f"{SLURM_NODELIST} or pass -H"
            )
        width = len(lo) if lo.startswith("0") else 1
        out += [str(i).zfill(width) for i in range(int(lo), int(hi if dash else lo) + 1)]
    return out


def _expand_one(pattern: str, where: str) -> list[str]:
    """Every string one node-list entry stands for: ``rack[1-2]-n[1-2]`` gives four."""
    m = re.fullmatch(r"([^\[\]]*)\[([^\[\]]*)\](.*)", pattern, re.S)
    if not m:
        if "[" in pattern or "]" in pattern:
            raise ConfigError(f"bad entry {pattern!r} in SLURM node list {where!r}; expected e.g. node[01-03,07]")
        return [pattern]
    head, body, rest = m.groups()
    tails = _expand_one(rest, where)
    numbers = _expand_range_set(body, where)
    if len(numbers) * len(tails) > MAX_NODES:
        raise ConfigError(
            f"entry {pattern!r} in SLURM node list {where!r} names more than {MAX_NODES} nodes; check "
            f"{SLURM_NODELIST} or pass -H"
        )
    return [f"{head}{n}{tail}" for n in numbers for tail in tails]


def expand_nodelist(text: str) -> tuple[str, ...]:
    """SLURM's compressed node list as names: ``"node[01-03,07],gpu1"`` -> node01 .. node07, gpu1."""
    names = []
    for entry in _split_top(text.strip()):
        expanded = _expand_one(entry.strip(), text)
        if not all(_NAME.fullmatch(name) for name in expanded):
            raise ConfigError(f"bad entry {entry!r} in SLURM node list {text!r}; expected e.g. node[01-03,07]")
        names += expanded
        if len(names) > MAX_NODES:
            raise ConfigError(
                f"SLURM node list {text!r} names more than {MAX_NODES} nodes; check {SLURM_NODELIST} or pass -H"
            )
    return tuple(names)


def expand_tasks_per_node(text: str) -> tuple[int, ...]:
    """SLURM_TASKS_PER_NODE as one count per node: ``"2(x3),1"`` -> ``(2, 2, 2, 1)``."""
    counts = []
    for entry in text.strip().split(","):
        m = re.fullmatch(r"([0-9]{1,12})(?:\(x([0-9]{1,12})\))?", entry.strip())
        if not m or int(m.group(1)) < 1 or (m.group(2) and int(m.group(2)) < 1):
            raise ConfigError(f"bad entry {entry!r} in {SLURM_TASKS_PER_NODE}={text!r}; expected e.g. 2(x3),1")
        repeat = int(m.group(2) or 1)
        if len(counts) + repeat > MAX_NODES:
            raise ConfigError(
                f"{SLURM_TASKS_PER_NODE}={text!r} counts more than {MAX_NODES} nodes; check it or pass -H host:slots"
            )
        counts += [int(m.group(1))] * repeat
    return tuple(counts)


def slurm_hosts(environ: Mapping[str, str]) -> tuple[Host, ...]:
    """The hosts of the SLURM allocation described by ``environ``, or ``()`` outside one.

    Env: SLURM_JOB_NODELIST (or SLURM_NODELIST), SLURM_TASKS_PER_NODE (1 slot per node when unset).
    """
    nodelist = environ.get(SLURM_NODELIST) or environ.get(SLURM_NODELIST_OLD)
    if not nodelist:
        return ()
    names = expand_nodelist(nodelist)
    per_node = environ.get(SLURM_TASKS_PER_NODE)
    counts = expand_tasks_per_node(per_node) if per_node else (1,) * len(names)
    if len(counts) != len(names):
        raise ConfigError(
            f"{SLURM_TASKS_PER_NODE}={per_node!r} gives {len(counts)} counts for the {len(names)} nodes in "
            f"{SLURM_NODELIST}={nodelist!r}; run inside the allocation as SLURM set it, or pass -H"
        )
    return _unique([Host(n, c) for n, c in zip(names, counts, strict=True)], f"{SLURM_NODELIST}={nodelist!r}")


def mpirun_uses_srun(environ: Mapping[str, str]) -> bool:
    """True inside a SLURM job: Open MPI's mpirun then starts its daemons with srun, not ssh.

    Its plm/slurm component takes over there, so the nodes need not accept ssh from each other.

    Env: SLURM_JOBID (set by sbatch, salloc and srun).
    """
    return bool(environ.get(SLURM_JOBID))


def mpi_operator_hostfile(
    environ: Mapping[str, str],
    default_path: str = MPI_OPERATOR_HOSTFILE,
    exists: Callable[[str], bool] = os.path.isfile,
) -> str | None:
    """The Kubeflow MPI Operator's hostfile path in this pod, or None outside one.

    Env: OMPI_MCA_orte_default_hostfile (the path; it must exist when set), else ``default_path``
    counts when the file is there.
    """
    path = environ.get(MPI_OPERATOR_HOSTFILE_VAR)
    if path:
        if not exists(path):
            raise ConfigError(
                f"{MPI_OPERATOR_HOSTFILE_VAR}={path!r} names no file; fix or unset it, or pass -H/--hostfile"
            )
        return path
    return default_path if exists(default_path) else None


def resolve(
    host_list: str | None = None,
    hostfile: str | None = None,
    environ: Mapping[str, str] | None = None,
    operator_hostfile: str = MPI_OPERATOR_HOSTFILE,
) -> tuple[tuple[Host, ...], str]:
    """``(hosts, origin)`` by precedence: -H > --hostfile > MPI Operator hostfile > SLURM > local.

    ``origin`` says where the hosts came from, for messages; local is ``((), "localhost")``.
    Env: see ``mpi_operator_hostfile`` and ``slurm_hosts``.
    """
    environ = {} if environ is None else environ
    if host_list:
        return parse_host_list(host_list), f"-H {host_list}"
    if hostfile:
        return read_hostfile(hostfile), f"--hostfile {hostfile}"
    path = mpi_operator_hostfile(environ, default_path=operator_hostfile)
    if path:
        return read_hostfile(path), f"the MPI Operator hostfile {path}"
    found = slurm_hosts(environ)
    if found:
        return found, f"the SLURM allocation ({SLURM_NODELIST})"
    return (), "localhost"


def format_hosts(hosts: Iterable[Host]) -> str:
    """``"a:2,b:2"``: the form mpirun -H and horovodrun -H both take."""
    return ",".join(str(h) for h in hosts)


def total_slots(hosts: Iterable[Host]) -> int:
    return sum(h.slots for h in hosts)


def is_local(hosts: Iterable[Host], here: Callable[[str], bool] | None = None) -> bool:
    """True when every host is this machine: by name (``localhost``, ``127.0.0.1``), or, with ``here``
    (``hvdkit.launcher.remote.is_this_machine``, which looks names up), whenever ``here(name)`` says so."""
    return all(h.name in LOCAL_NAMES or (here is not None and here(h.name)) for h in hosts)


def check_slots(hosts: Sequence[Host], num_proc: int, origin: str = "the hosts given") -> None:
    """Raise ConfigError when ``num_proc`` ranks do not fit the hosts' slots (no check for local)."""
    total = total_slots(hosts)
    if hosts and num_proc > total:
        raise ConfigError(
            f"-np {num_proc} needs {num_proc} slots, more than the {total} from {origin} ({format_hosts(hosts)}); "
            f"lower -np to {total} or add hosts or slots (-H host:slots,... or --hostfile FILE)"
        )
