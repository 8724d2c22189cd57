"""Old public names kept for one release: using one warns (DeprecationWarning), then does what the new name does.

    scale_lr = deprecated_function(ScaledLRScheduler, "hvdkit.torch.scale_lr", "hvdkit.torch.ScaledLRScheduler")

    class MetricAverage(Deprecated, MetricAverageCallback):
        '''Deprecated name of ``MetricAverageCallback``.'''
        renamed = ("hvdkit.keras.MetricAverage", "hvdkit.keras.MetricAverageCallback")

``docs/api/names.md`` lists every old name with its new one; a unit test checks that list against
the adapters' ``__all__`` and that every old name warns.
"""

from __future__ import annotations

import functools
import inspect
import warnings
from collections.abc import Callable
from typing import Any, TypeVar

from .errors import ConfigError

__all__ = ["REMOVED_IN", "Deprecated", "deprecated_function", "renamed_argument", "warn_renamed"]

REMOVED_IN = "0.3"

_T = TypeVar("_T")


def warn_renamed(old: str, new: str, stacklevel: int = 3) -> None:
    """Warn (DeprecationWarning) that ``old`` is now ``new``; ``stacklevel`` 3 points at the caller's caller."""
    warnings.warn(
        f"{old} is deprecated and will be removed in hvdkit {REMOVED_IN}; use {new} instead",
        DeprecationWarning,
        stacklevel=stacklevel,
    )


def renamed_argument(old_value: _T | None, new_value: _T | None, old: str, new: str) -> _T | None:
    """``new_value``, or ``old_value`` with a warning when the caller used the old keyword ``old``.

    None means "not passed"; passing both is a ConfigError naming them.
    """
    if old_value is None:
        return new_value
    if new_value is not None:
        raise ConfigError(f"{old} and {new} are the same argument; pass only {new}")
    warn_renamed(old, new, stacklevel=4)  # the caller of the function that took the argument
    return old_value


def deprecated_function(new: Callable[..., Any], old_name: str, new_name: str) -> Callable[..., Any]:
    """A function named after ``old_name`` that warns, then returns ``new(*args, **kwargs)``."""

    @functools.wraps(new)
    def old(*args, **kwargs):
        warn_renamed(old_name, new_name)
        return new(*args, **kwargs)

    old.__name__ = old.__qualname__ = old_name.rpartition(".")[2]
    old.__doc__ = f"Deprecated (removed in hvdkit {REMOVED_IN}): use ``{new_name}``, which takes the same arguments."
    old.renamed = (old_name, new_name)
    return old


class Deprecated:
    """Mixin for an old class name over its new class: constructing it warns, then builds the new class.

    The subclass sets ``renamed = (old public name, new public name)`` and lists the new class right
    after this mixin, so instances pass ``isinstance`` for both names.
    """

    renamed = None

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        # The old name shows the new class's arguments (in help() and the API reference).
        mro = cls.__mro__
        cls.__signature__ = inspect.signature(mro[mro.index(Deprecated) + 1])

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        warn_renamed(*self.renamed)
        super().__init__(*args, **kwargs)
