"""The ``--timeline`` flag of a job: the file name checked early, the env names Horovod reads, the folder made.

What the job spec and the plan need, without the timeline reader (``timeline``) or plotting.
"""

from __future__ import annotations

import os

from ..core import env as _env
from ..core.errors import ConfigError

__all__ = ["TIMELINE", "MARK_CYCLES", "timeline_path", "ensure_folder"]

TIMELINE = _env.HOROVOD_TIMELINE  # the file rank 0 writes
MARK_CYCLES = _env.HOROVOD_TIMELINE_MARK_CYCLES  # "1": a CYCLE_START record per Horovod cycle


def timeline_path(path: str) -> str:
    """``path`` made absolute, once its folder exists or could be created; ConfigError otherwise."""
    if not isinstance(path, str) or not path.strip():
        raise ConfigError(f"--timeline needs a file name, e.g. --timeline out/timeline.json (got {path!r})")
    full = os.path.abspath(os.path.expanduser(path))
    if os.path.isdir(full):
        raise ConfigError(
            f"--timeline {path!r} is a directory; give a file in it, e.g. {os.path.join(path, 'timeline.json')}"
        )
    folder = probe = os.path.dirname(full)
    while not os.path.exists(probe):  # the nearest existing ancestor decides whether mkdir -p can work
        probe = os.path.dirname(probe)
    if not os.path.isdir(probe) or not os.access(probe, os.W_OK | os.X_OK):
        why = "is not a directory" if not os.path.isdir(probe) else "is not writable"
        raise ConfigError(
            f"--timeline {path!r}: folder {folder!r} cannot be created or written ({probe!r} {why}); "
            "choose a path in a writable folder"
        )
    if os.path.exists(full) and not os.access(full, os.W_OK):
        raise ConfigError(f"--timeline {path!r}: the file exists and is not writable; remove it or choose another path")
    return full


def ensure_folder(path: str) -> None:
    """Create the folder of ``path``: Horovod skips the timeline with only a log line when it is missing."""
    try:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    except OSError as e:
        raise ConfigError(f"cannot create the folder of timeline {path!r}: {e.strerror}; choose another path") from None
