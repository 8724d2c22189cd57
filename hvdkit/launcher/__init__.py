"""Planning and running jobs. Never imports torch, TensorFlow or Horovod.

``plan`` turns a typed ``JobSpec`` into an argv list plus environment (pure); ``execute`` is the
one place that starts processes.
"""

from .spec import CONTROLLERS, JobSpec

__all__ = ["CONTROLLERS", "JobSpec"]
