"""Running a job to completion: relaunch it after a failure, up to a limit, and say what happened."""

import secrets
import sys
from dataclasses import dataclass, field

from . import execute

__all__ = ["Report", "supervise"]


@dataclass(frozen=True)
class Report:
    """Every attempt's JobResult, the last one deciding the exit code."""

    attempts: list = field(default_factory=list)

    @property
    def final(self):
        return self.attempts[-1]

    @property
    def restarts(self):
        return len(self.attempts) - 1

    def summary(self):
        """The closing line: what failed, how, and how many restarts were used."""
        failed = [(i, r) for i, r in enumerate(self.attempts) if r.exit_code != 0]
        history = "; ".join(f"attempt {i + 1}: {r.message}" for i, r in failed)
        used = f"{self.restarts} restart{'s' if self.restarts != 1 else ''} used"
        if self.final.exit_code == 0:
            return f"job finished after {used} ({history})" if failed else ""
        tail = f"; {used}" if self.restarts else ""
        return f"{self.final.message} (exit code {self.final.exit_code}{tail})" + (
            f"; earlier: {'; '.join(f'attempt {i + 1}: {r.message}' for i, r in failed[:-1])}" if len(failed) > 1 else ""
        )


def supervise(build_plan, max_restarts=0, grace=30.0, forward_usr1=True, err=None, run=execute.run):
    """Run the job; after a failure relaunch it, at most ``max_restarts`` times.

    ``build_plan(job_id, attempt)`` returns the Plan of one attempt (attempt 0 is the first
    launch), ``job_id`` a fresh random id that tags the reports of that attempt's ranks; the ranks
    resume from their newest checkpoint by themselves. A job stopped by a signal sent to the
    launcher is not restarted. Nothing is written to disk, so nothing is left behind, however
    the launcher ends.
    """
    err = err or sys.stderr
    attempts = []
    for attempt in range(max_restarts + 1):
        job_id = secrets.token_hex(8)
        result = run(build_plan(job_id, attempt), job_id=job_id, grace=grace, forward_usr1=forward_usr1)
        attempts.append(result)
        if result.exit_code == 0 or result.interrupted_by is not None:
            break
        if attempt < max_restarts:
            err.write(f"hvdkit run: {result.message}; restarting ({attempt + 1}/{max_restarts})\n")
            err.flush()
    return Report(attempts)
