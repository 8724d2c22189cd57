"""Planning and running jobs. Never imports torch, TensorFlow or Horovod.

``spec`` (JobSpec: what to run) -> ``plan`` (the exact argv and environment; pure) -> ``job``
(``run_job``: attempts, restarts, elastic membership, the summary and exit code) -> ``execute``
(the one place that starts processes). ``hosts`` and ``elastic/`` say where ranks run,
``render/`` writes cluster files from the same description.
"""

from .job import RunOptions, run_job
from .spec import CONTROLLERS, JobSpec

__all__ = ["CONTROLLERS", "JobSpec", "RunOptions", "run_job"]
