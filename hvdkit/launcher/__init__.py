"""Planning and running jobs. Never imports torch, TensorFlow or Horovod.

``spec`` (JobSpec: what to run) -> ``plan`` (the exact argv and environment; pure) -> ``job``
(``run_job``: attempts, restarts, elastic membership, the summary and exit code) -> ``execute``
(the one place that starts a job's launcher; ``child`` runs every other command: tune trials,
benchmark jobs, doctor's checks). ``hosts`` and ``elastic/`` say where ranks run,
``render/`` writes cluster files from the same description.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .spec import CONTROLLERS, JobSpec

if TYPE_CHECKING:
    from .job import RunOptions, run_job

__all__ = ["CONTROLLERS", "JobSpec", "RunOptions", "run_job"]


def __getattr__(name: str) -> Any:
    # job imports execute and so rankwrap: loaded on first use, so that `python -m
    # hvdkit.launcher.rankwrap` (every rank's wrapper) does not find itself imported already.
    if name in ("RunOptions", "run_job"):
        from . import job

        return getattr(job, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
