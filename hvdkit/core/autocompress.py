"""``compression="auto"``: choose fp16 or none from timed allreduces of the model's own gradients.

The framework-free half. The adapters (``hvdkit.torch.autocompress``,
``hvdkit.tensorflow.autocompress``) time an fp32 and an fp16 allreduce of buffers shaped like the
model's gradients, take the slowest rank's median of each (so every rank holds the same two
numbers) and hand them to ``decide``, which is pure: fp16 only when it is faster by more than
``margin`` (fp32 averaging is exact, so a tie or noise keeps it). ``resolve_compression`` is the
one place the precedence is written down: an explicit ``"none"``/``"fp16"`` argument wins, then the
``HVDKIT_COMPRESSION`` variable (when the argument is ``"auto"``), then the measurement.

Env: HVDKIT_COMPRESSION (``none``, ``fp16`` or ``auto``; read only when the argument is ``"auto"``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from . import env as _env
from .errors import ConfigError
from .options import AUTO, check_compression

__all__ = [
    "DEFAULT_MARGIN",
    "DEFAULT_REPS",
    "Decision",
    "fp32_bytes",
    "median",
    "decide",
    "reps_for",
    "resolve_compression",
    "wanted_compression",
]

DEFAULT_MARGIN = 0.10  # fp16 must save more than 10 % of the allreduce time to be chosen
DEFAULT_REPS = 5  # timed repetitions of each variant (at least), interleaved, after one untimed warm-up each
MAX_REPS = 25


def fp32_bytes(shapes: Iterable[Sequence[int]]) -> int:
    """Bytes of fp32 tensors of ``shapes`` (what one grouped allreduce of the gradients sends)."""
    return sum(4 * math.prod(int(d) for d in shape) for shape in shapes)


def median(values: Sequence[float]) -> float:
    """The median of ``values`` (the mean of the middle two for an even count)."""
    values = sorted(values)
    mid = len(values) // 2
    return values[mid] if len(values) % 2 else 0.5 * (values[mid - 1] + values[mid])


def reps_for(nbytes: int, budget_bytes: int = 64 << 20) -> int:
    """Timed repetitions of each variant for gradients of ``nbytes``: more for small ones, which are cheap and noisy.

    Depends on the size alone, so every rank runs the same number of collectives.
    """
    return int(min(MAX_REPS, max(DEFAULT_REPS, budget_bytes // max(1, int(nbytes)))))


@dataclass(frozen=True)
class Decision:
    """What ``compression="auto"`` chose and why (the same on every rank).

    ``fp32_s`` and ``fp16_s`` are seconds per allreduce of all the gradients (the slowest rank's
    median); ``nbytes`` their fp32 size, ``tensors`` how many; ``source`` is ``"measured"``,
    ``"env"`` (HVDKIT_COMPRESSION) or ``"single rank"`` (nothing to average).
    """

    choice: str
    fp32_s: float
    fp16_s: float
    nbytes: int
    tensors: int
    margin: float = DEFAULT_MARGIN
    source: str = "measured"

    @property
    def speedup(self) -> float:
        """fp32 time / fp16 time (> 1 when fp16 is faster); NaN when nothing was timed."""
        if not self.fp16_s or math.isnan(self.fp16_s) or math.isnan(self.fp32_s):
            return math.nan
        return self.fp32_s / self.fp16_s

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "speedup": self.speedup}

    def message(self) -> str:
        """The line rank 0 logs."""
        if self.source != "measured":
            return f"compression='auto' -> {self.choice!r} ({self.source})"
        return (
            f"compression='auto' -> {self.choice!r}: allreduce of {self.tensors} gradients, "
            f"{self.nbytes / 1e6:.2f} MB fp32, takes {self.fp32_s * 1e3:.3f} ms in fp32 and "
            f"{self.fp16_s * 1e3:.3f} ms in fp16 (fp16 must be > {self.margin:.0%} faster to be chosen); "
            f"set compression='none'/'fp16' or HVDKIT_COMPRESSION to override"
        )


def _check_seconds(name, value):
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise ConfigError(f"{name} must be a finite number of seconds > 0 (got {value!r})")
    return float(value)


def decide(fp32_s: float, fp16_s: float, margin: float = DEFAULT_MARGIN) -> str:
    """``"fp16"`` if ``fp16_s < fp32_s * (1 - margin)``, else ``"none"``: pure, no collective.

    The margin keeps exact fp32 averaging unless fp16 clearly pays, so timing noise between two
    nearly equal options does not flip the choice. Every rank passes the same two numbers (the
    adapters take the slowest rank's), so every rank decides alike.
    """
    fp32_s = _check_seconds("fp32_s", fp32_s)
    fp16_s = _check_seconds("fp16_s", fp16_s)
    if isinstance(margin, bool) or not isinstance(margin, (int, float)) or not 0 <= margin < 1:
        raise ConfigError(f"margin must be a number in [0, 1) (got {margin!r}); e.g. 0.1 for 10 %")
    return "fp16" if fp16_s < fp32_s * (1.0 - margin) else "none"


def wanted_compression(value: str | None, environ: Mapping[str, str] | None = None) -> str:
    """``value`` checked; when it is ``"auto"``, HVDKIT_COMPRESSION if set (none/fp16/auto), else ``"auto"``.

    ``None`` means ``"none"``. Raises ConfigError naming the bad value and the choices.
    Env: HVDKIT_COMPRESSION.
    """
    value = check_compression(value, allow_auto=True)
    if value != AUTO:
        return value
    return _env.read_choice(_env.COMPRESSION, _env.COMPRESSION_CHOICES, AUTO, environ=environ)


def resolve_compression(
    value: str | None,
    measure: Callable[[], tuple[float, float, int, int]],
    size: int,
    log: Callable[[str], Any] | None = None,
    environ: Mapping[str, str] | None = None,
    agree: Callable[[str], str] | None = None,
) -> tuple[str, Decision]:
    """The compression to use (``"none"`` or ``"fp16"``) and the Decision behind it.

    ``measure()`` returns ``(fp32_s, fp16_s, nbytes, tensors)`` identical on every rank; it is called
    only when the choice is left to the measurement and ``size`` > 1. ``agree(wanted)`` returns rank
    0's ``wanted`` on every rank (a broadcast), so a variable set on some hosts only cannot make
    ranks disagree about measuring. ``log(message)`` is called (the adapters pass it on rank 0
    only) when ``value`` was ``"auto"``.
    Collective: with ``value="auto"`` on more than one rank, ``agree`` and ``measure`` are; every rank calls this alike.
    Env: HVDKIT_COMPRESSION.
    """
    auto = check_compression(value, allow_auto=True) == AUTO
    wanted = wanted_compression(value, environ)
    if auto and size > 1 and agree is not None:
        wanted = agree(wanted)
    if wanted != AUTO:
        decision = Decision(wanted, math.nan, math.nan, 0, 0, source="env HVDKIT_COMPRESSION" if auto else "explicit")
    elif size <= 1:
        decision = Decision("none", math.nan, math.nan, 0, 0, source="single rank")
    else:
        fp32_s, fp16_s, nbytes, tensors = measure()
        decision = Decision(decide(fp32_s, fp16_s), fp32_s, fp16_s, int(nbytes), int(tensors))
    if auto and log is not None:
        log(decision.message())
    return decision.choice, decision
