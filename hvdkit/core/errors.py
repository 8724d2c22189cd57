"""One error hierarchy for hvdkit.

Every class is also the matching built-in (``ValueError``, ``RuntimeError``, ``ImportError``) so
generic handlers keep working. Messages name the bad value and end with the fix.
"""

__all__ = [
    "HvdkitError",
    "ConfigError",
    "MissingDependencyError",
    "CollectiveError",
    "CheckpointError",
    "LaunchError",
]


class HvdkitError(Exception):
    """Root of every error hvdkit raises on purpose."""


class ConfigError(HvdkitError, ValueError):
    """A value given by the user (flag, argument, variable) is not acceptable."""


class MissingDependencyError(HvdkitError, ImportError):
    """A framework, Horovod, or a Horovod feature is not installed or not built in."""


class CollectiveError(HvdkitError, RuntimeError):
    """Ranks disagree about a collective, or one rank failed inside it."""


class CheckpointError(HvdkitError, RuntimeError):
    """A checkpoint could not be written, verified or restored."""


class LaunchError(HvdkitError, RuntimeError):
    """A job could not be planned or started."""
