"""Loud, lazy imports of a framework and Horovod's support for it (the adapters' ``_engine``).

Framework-free: the modules are named, not imported, here; they load only when an adapter asks.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from .errors import MissingDependencyError

__all__ = ["import_engine"]


def import_engine(framework: str, label: str, horovod_module: str, adapter: str) -> ModuleType:
    """The ``horovod_module`` module (e.g. ``"horovod.torch"``) after importing ``framework``
    (``"torch"``, shown as ``label``); MissingDependencyError naming what is missing and the fix."""
    fix = f"run `make setup` (it builds Horovod against the pinned {label}), or see README.md"
    try:
        importlib.import_module(framework)
    except ImportError as e:
        raise MissingDependencyError(f"{adapter} needs {label} ({e}); {fix}") from e
    try:
        return importlib.import_module(horovod_module)
    except ImportError as e:
        raise MissingDependencyError(
            f"Horovod with {label} support is not importable ({e}); "
            f"it must be built against the installed {label}: {fix}"
        ) from e
