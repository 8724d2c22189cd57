"""Validation of the options shared by the framework adapters."""

import math

from .errors import ConfigError

__all__ = ["COMPRESSIONS", "check_compression", "check_number_above", "check_positive_int"]

COMPRESSIONS = ("none", "fp16")


def check_compression(value):
    """``value`` if it names a gradient compression hvdkit supports, else ConfigError."""
    if value is None:
        return "none"
    if value not in COMPRESSIONS:
        raise ConfigError(
            f"compression must be one of {', '.join(map(repr, COMPRESSIONS))} (got {value!r}); "
            "use 'fp16' to halve the bytes on the wire or 'none' for exact fp32 averaging"
        )
    return value


def check_positive_int(name, value):
    """``value`` if it is an int >= 1, else ConfigError naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{name} must be an integer >= 1 (got {value!r})")
    return value


def check_number_above(name, value, bound=0.0, hint=""):
    """``value`` as a float if it is a finite number > ``bound``, else ConfigError naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= bound:
        raise ConfigError(f"{name} must be a finite number > {bound:g} (got {value!r}){'; ' + hint if hint else ''}")
    return float(value)
