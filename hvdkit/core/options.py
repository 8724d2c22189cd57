"""Validation of the options shared by the framework adapters."""

from __future__ import annotations

import math
from typing import Any

from .errors import ConfigError

__all__ = [
    "AUTO",
    "COMPRESSIONS",
    "COMPRESSION_MODES",
    "check_compression",
    "check_int_at_least",
    "check_number_above",
    "check_number_at_least",
    "check_positive_int",
]

COMPRESSIONS = ("none", "fp16")
AUTO = "auto"
COMPRESSION_MODES = (*COMPRESSIONS, AUTO)  # what the adapters accept: "auto" measures (hvdkit.core.autocompress)


def check_compression(value: str | None, allow_auto: bool = False) -> str:
    """``value`` if it names a gradient compression hvdkit supports, else ConfigError.

    ``"auto"`` is accepted only with ``allow_auto``.
    """
    if value is None:
        return "none"
    choices = COMPRESSION_MODES if allow_auto else COMPRESSIONS
    if not isinstance(value, str) or value not in choices:
        raise ConfigError(
            f"compression must be one of {', '.join(map(repr, choices))} (got {value!r}); "
            "use 'fp16' to halve the bytes on the wire or 'none' for exact fp32 averaging"
            + (", or 'auto' to time both at start-up and keep the faster" if allow_auto else "")
        )
    return value


def _hint(hint):
    return f"; {hint}" if hint else ""


def check_int_at_least(name: str, value: Any, minimum: int = 0, hint: str = "", what: str | None = None) -> int:
    """``value`` if it is an int >= ``minimum`` (not a bool), else ConfigError naming ``name``.

    ``what`` replaces "an integer >= minimum" in the message; ``hint`` ends it.
    """
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigError(f"{name} must be {what or f'an integer >= {minimum}'} (got {value!r}){_hint(hint)}")
    return value


def check_positive_int(name: str, value: Any, hint: str = "", what: str | None = None) -> int:
    """``value`` if it is an int >= 1 (not a bool), else ConfigError naming ``name``."""
    return check_int_at_least(name, value, 1, hint, what)


def _is_number(value):
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def check_number_above(name: str, value: Any, bound: float = 0.0, hint: str = "", what: str | None = None) -> float:
    """``value`` as a float if it is a finite number > ``bound`` (not a bool), else ConfigError naming ``name``.

    ``what`` replaces "a finite number > bound" in the message.
    """
    if not _is_number(value) or value <= bound:
        raise ConfigError(f"{name} must be {what or f'a finite number > {bound:g}'} (got {value!r}){_hint(hint)}")
    return float(value)


def check_number_at_least(name: str, value: Any, bound: float = 0.0, hint: str = "", what: str | None = None) -> float:
    """``value`` as a float if it is a finite number >= ``bound`` (not a bool), else ConfigError naming ``name``."""
    if not _is_number(value) or value < bound:
        raise ConfigError(f"{name} must be {what or f'a finite number >= {bound:g}'} (got {value!r}){_hint(hint)}")
    return float(value)
