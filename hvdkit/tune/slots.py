"""Which CPU cores each running trial gets: disjoint groups, never more than the machine has."""

from __future__ import annotations

import os
from collections.abc import Sequence

from ..core.errors import ConfigError

__all__ = ["plan_slots", "SlotPool", "local_cores"]


def local_cores() -> list[int]:
    """The CPU cores this process may run on (its affinity), in order: what ``hvdkit run`` counts as slots here."""
    return sorted(os.sched_getaffinity(0))


def plan_slots(parallel: int, num_proc: int, cores: Sequence[int]) -> list[tuple[int, ...]]:
    """``parallel`` disjoint groups of ``num_proc`` cores each, taken in order from ``cores``.

    Each trial's ``hvdkit run`` is pinned to its group (its ranks inherit it; ``hvdkit run`` counts
    the group as this machine's cores), so trials never share a core. Raises ConfigError when
    ``parallel * num_proc`` exceeds ``len(cores)``, naming what fits.
    """
    for flag, value in (("--parallel", parallel), ("-np", num_proc)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(f"{flag} must be an integer >= 1 (got {value!r})")
    cores = list(cores)
    need = parallel * num_proc
    if need > len(cores):
        fits = max(1, len(cores) // num_proc) if num_proc <= len(cores) else 0
        hint = (
            f"use --parallel {fits} with -np {num_proc}"
            if fits
            else f"-np {num_proc} alone needs more cores than there are: use -np {len(cores)} or fewer"
        )
        raise ConfigError(
            f"--parallel {parallel} trials x -np {num_proc} ranks need {need} cores, but this machine gives "
            f"{len(cores)} (cores {','.join(map(str, cores))}); trials never share cores: {hint}"
        )
    return [tuple(cores[i * num_proc : (i + 1) * num_proc]) for i in range(parallel)]


class SlotPool:
    """The core groups of ``plan_slots``: ``take()`` one for a starting trial, ``give(group)`` it back at its end."""

    def __init__(self, groups: Sequence[tuple[int, ...]]) -> None:
        self._free = list(groups)
        self._all = set(groups)

    def free(self) -> int:
        return len(self._free)

    def take(self) -> tuple[int, ...]:
        if not self._free:
            raise RuntimeError("no free core group: start a trial only when free() > 0")
        return self._free.pop(0)

    def give(self, group: tuple[int, ...]) -> None:
        if group not in self._all or group in self._free:
            raise RuntimeError(f"core group {group} was not taken from this pool")
        self._free.append(group)
        self._free.sort()
