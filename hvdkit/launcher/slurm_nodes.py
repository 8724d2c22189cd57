"""Which nodes of a SLURM allocation can run ranks, as SLURM sees them: no ssh between nodes.

Inside an allocation Open MPI's mpirun starts its daemons with srun (``hosts.mpirun_uses_srun``),
so fixed-size jobs never need ssh between nodes; an elastic job there asks SLURM instead of ssh
which of its nodes are up: ``sinfo --nodes=LIST`` and each node's state. Down, drained, failed,
powered-off or not responding (a ``*`` after the state) nodes are left out, with SLURM's word for it.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Iterable

from .hosts import Host

__all__ = ["parse_sinfo", "unavailable"]

SINFO_FORMAT = "%n %T"  # node name, extended state (e.g. "idle", "allocated", "down*", "drained")
_DOWN = {"down", "drained", "fail", "failing", "unknown", "future", "power_down", "powered_down", "powering_down"}


def parse_sinfo(text: str) -> dict[str, str]:
    """``{node: state}`` from ``sinfo --noheader --format='%n %T'`` output (malformed lines skipped)."""
    states = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2:
            states[parts[0]] = parts[1].lower()
    return states


def why_down(state: str) -> str | None:
    """SLURM's reason a node in ``state`` cannot run ranks now, or None when it can."""
    base = state.rstrip("*~#!%$@^+-")
    if state.endswith("*"):
        return f"SLURM reports it not responding ({state})"
    if state.endswith("~") or base in _DOWN:
        return f"SLURM reports it {state}"
    return None


def unavailable(
    hosts: Iterable[Host], timeout: float = 15, run: Callable[..., subprocess.CompletedProcess[str]] = subprocess.run
) -> dict[str, str]:
    """``{name: why}`` for the hosts SLURM says cannot run ranks (down, drained, not responding, not
    listed). ``{}`` when sinfo cannot answer: the attempt's own failure is then what counts."""
    names = [h.name for h in hosts]
    if not names:
        return {}
    try:
        p = run(
            ["sinfo", "--noheader", f"--nodes={','.join(names)}", f"--format={SINFO_FORMAT}"],
            capture_output=True,
            text=True,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
        )
    except (OSError, subprocess.TimeoutExpired):
        return {}
    if p.returncode != 0:
        return {}
    states = parse_sinfo(p.stdout)
    out = {}
    for name in names:
        why = "not listed by SLURM's sinfo" if name not in states else why_down(states[name])
        if why:
            out[name] = why
    return out
