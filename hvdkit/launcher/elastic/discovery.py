"""Which hosts are there now, for elastic jobs: a discovery script's answer, or a fixed list.

A discovery script (``--host-discovery-script``, as horovodrun's) prints one ``host:slots`` line
per host that may run ranks now (``host`` alone has 1 slot; blank lines and ``#`` comments are
skipped) and exits 0. It is run again at every poll, so it can read whatever the cluster says
(a file, a scheduler, the MPI Operator's ``/etc/mpi/discover_hosts.sh``). Without a script the
hosts are fixed (-H, a hostfile, SLURM, the MPI Operator's hostfile) and only the ssh check decides
which of them are there. Parsing is pure; ``ScriptDiscovery`` runs the script.
"""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Iterable

from ...core.errors import ConfigError, LaunchError
from ..hosts import _NAME, Host, _slots

__all__ = ["DiscoveryError", "parse_discovery_output", "ScriptDiscovery", "FixedDiscovery"]

_FORMAT = "expected one 'host:slots' line per host, e.g. node1:4 (a host alone has 1 slot)"


class DiscoveryError(LaunchError):
    """The discovery script could not be run, failed, or printed something that is not a host list."""


def parse_discovery_output(
    text: str, source: str = "the host discovery script", default_slots: int = 1
) -> tuple[Host, ...]:
    """The hosts in a discovery script's output, in order; ``()`` when it lists none. A host listed
    without ``:slots`` has ``default_slots``.

    Raises DiscoveryError naming the line for anything but ``host[:slots]`` lines, and for a
    host listed twice.
    """
    hosts, seen = [], set()
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        name, sep, count = line.partition(":")
        slots = _slots(count.strip()) if sep else default_slots
        name = name.strip()
        if not _NAME.fullmatch(name) or slots is None:
            raise DiscoveryError(f"{source}, line {number}: bad entry {line!r}; {_FORMAT}")
        if name in seen:
            raise DiscoveryError(
                f"{source}, line {number}: host {name!r} is listed twice; list it once with all its slots"
            )
        seen.add(name)
        hosts.append(Host(name, slots))
    return tuple(hosts)


class ScriptDiscovery:
    """Hosts from running ``path`` (an executable) each time ``hosts()`` is called."""

    def __init__(self, path: str, timeout: float = 30.0, default_slots: int = 1) -> None:
        self.path = os.path.abspath(path)
        self.timeout = timeout
        self.default_slots = default_slots  # of a host listed without ":slots"

    def check(self) -> None:
        """Raise ConfigError when the script is missing or not executable (before anything starts)."""
        if not os.path.isfile(self.path):
            raise ConfigError(
                f"--host-discovery-script {self.path!r} is not a file; give the path of an executable script"
            )
        if not os.access(self.path, os.X_OK):
            raise ConfigError(f"--host-discovery-script {self.path!r} is not executable; chmod +x it")

    def hosts(self) -> tuple[Host, ...]:
        """The hosts the script lists now; DiscoveryError when it fails, hangs or prints garbage.

        The script runs in a process group of its own, ended whole when it hangs: what it started
        (an ``sleep``, an ``ssh``, a ``kubectl``) does not outlive the poll."""
        try:
            p = subprocess.Popen(
                [self.path],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                stdin=subprocess.DEVNULL,
                text=True,
                start_new_session=True,
            )
        except OSError as e:
            raise DiscoveryError(f"cannot run host discovery script {self.path}: {e.strerror}") from None
        try:
            out, err = p.communicate(timeout=self.timeout)
        except subprocess.TimeoutExpired:
            _end_group(p)
            raise DiscoveryError(
                f"host discovery script {self.path} gave no answer within {self.timeout:g} s"
            ) from None
        if p.returncode != 0:
            tail = (err.strip().splitlines() or [""])[-1]
            raise DiscoveryError(f"host discovery script {self.path} exited with code {p.returncode}: {tail}")
        return parse_discovery_output(out, f"host discovery script {self.path}", self.default_slots)

    def __str__(self) -> str:
        return f"--host-discovery-script {self.path}"


def _end_group(proc: subprocess.Popen[str]) -> None:
    """SIGKILL the process group ``proc`` leads (its own: ``start_new_session``) and reap ``proc``."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.communicate()


class FixedDiscovery:
    """The same hosts every time (from -H, a hostfile, SLURM or the MPI Operator's hostfile)."""

    def __init__(self, hosts: Iterable[Host], origin: str) -> None:
        self._hosts = tuple(hosts)
        self.origin = origin

    def check(self) -> None:
        pass

    def hosts(self) -> tuple[Host, ...]:
        return self._hosts

    def __str__(self) -> str:
        return self.origin
