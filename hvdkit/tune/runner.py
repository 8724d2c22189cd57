"""How a trial's job is started and stopped: the ``TrialRunner`` interface and its local implementation.

``hvdkit tune`` plans trials and talks to the study; a runner only starts one trial's job and lets the
driver poll it, stop it gracefully (pruning: the preemption path) or end it. ``LocalRunner`` runs
``hvdkit run -np K`` on this machine, pinned to its core group, in its own process group. Other
backends (Ray placement groups, SLURM steps) implement the same three calls.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

from ..core import env as _env
from ..launcher.child import Child

__all__ = ["TrialLaunch", "TrialJob", "TrialRunner", "LocalRunner", "hvdkit_run_argv"]


@dataclass(frozen=True)
class TrialLaunch:
    """One attempt of a trial: ``command`` (with its ``--name value`` flags) on ``num_proc`` ranks,
    on the core group ``cores``; its output goes to ``log_path``, its reports to ``report_path``."""

    number: int
    command: tuple
    num_proc: int
    cores: tuple
    log_path: str
    report_path: str
    run_flags: tuple = ()  # extra `hvdkit run` flags, e.g. ("--gloo",)
    env: dict = field(default_factory=dict)


class TrialJob(Protocol):
    """A started trial: ``poll()`` its exit code (None while it runs), ``stop()`` it gracefully,
    ``kill()`` it and everything it started."""

    def poll(self) -> int | None: ...

    def stop(self) -> None: ...

    def kill(self) -> None: ...


class TrialRunner(Protocol):
    """Starts trials: ``start(launch)`` returns the running ``TrialJob``."""

    def start(self, launch: TrialLaunch) -> TrialJob: ...


def hvdkit_run_argv(launch: TrialLaunch, python: str | None = None) -> list[str]:
    """``python -m hvdkit.tune.pin CORES -- python -m hvdkit run -np K FLAGS -- COMMAND``: pure."""
    python = python or sys.executable
    cores = ",".join(str(c) for c in launch.cores)
    run = [python, "-m", "hvdkit", "run", "-np", str(launch.num_proc), *launch.run_flags, "--", *launch.command]
    return [python, "-m", "hvdkit.tune.pin", cores, "--", *run]


class LocalProcess:
    """A trial's ``hvdkit run`` on this machine: a ``Child`` (the leader of its own process group)
    whose output goes to the trial's log."""

    def __init__(self, launch: TrialLaunch, base_env: Mapping[str, str] | None = None) -> None:
        env = dict(os.environ if base_env is None else base_env)
        env.update(launch.env)
        env[_env.TUNE_REPORT] = launch.report_path
        env[_env.TUNE_TRIAL] = str(launch.number)
        self._log = open(launch.log_path, "ab")  # noqa: SIM115 - closed when the process has ended
        self.child = Child(hvdkit_run_argv(launch), env=env, output=self._log)
        self.pid = self.child.pid

    @property
    def stopped_at(self) -> float | None:
        """``time.monotonic()`` when ``stop()`` was first called, or None."""
        return self.child.stopped_at

    def poll(self) -> int | None:
        code = self.child.poll()
        if code is not None and not self._log.closed:
            self._log.close()
        return code

    def stop(self) -> None:
        """SIGTERM to ``hvdkit run``: its ranks get SIGTERM, checkpoint at the next step and exit
        (``hvdkit run --grace-period`` bounds it). Returns at once: the caller kills it later if need be."""
        if self.stopped_at is None and self.child.poll() is None:
            self.child.terminate(group=False)

    def kill(self) -> None:
        """SIGKILL to the trial's process group (``hvdkit run`` then takes its ranks down: they watch it)."""
        self.child.kill()
        self.poll()


class LocalRunner:
    """Runs each trial as ``hvdkit run`` on this machine (see ``hvdkit_run_argv``)."""

    def __init__(self, base_env: Mapping[str, str] | None = None) -> None:
        self.base_env = base_env

    def start(self, launch: TrialLaunch) -> LocalProcess:
        return LocalProcess(launch, self.base_env)


def tail(path: str, lines: int = 15, limit: int = 64 * 1024) -> str:
    """The last ``lines`` lines of the file ``path`` (at most its last ``limit`` bytes), '' if unreadable."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - limit))
            text = f.read().decode(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.rstrip("\n").splitlines()[-lines:])
