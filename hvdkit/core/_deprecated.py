"""hvdkit.core's deprecated names, kept for one release (removed in hvdkit 0.3): each warns, then works.

``hvdkit.core.tracking.tracker_for`` (the old module path answers through ``hvdkit._deprecated``).
The old argument order of ``hvdkit.core.scaled_lr(base_lr, size, rule)`` is handled inside
``hvdkit.core.lr.scaled_lr`` itself.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .comm import Communicator
from .deprecation import warn_renamed
from .monitoring.tracking import Tracker

__all__ = ["tracker_for"]


def tracker_for(communicator: Callable[[], Communicator]) -> Callable[..., Tracker]:
    """Deprecated (the adapters' ``Tracker`` are classes now): a ``Tracker`` constructor bound to ``communicator()``."""
    warn_renamed("hvdkit.core.tracking.tracker_for", "the adapters' Tracker class (hvdkit.torch.Tracker, ...)")

    def make_tracker(log_dir: str, **options: Any) -> Tracker:
        return Tracker(communicator(), log_dir, **options)

    return make_tracker
