"""The search space of ``hvdkit tune``: a YAML mapping of flag names to distributions, parsed strictly.

    lr: {type: float, low: 1e-4, high: 1e-1, log: true}
    batch-size: {type: int, low: 16, high: 128, step: 16}
    optimizer: {type: categorical, choices: [sgd, adam]}

Each key becomes the flag ``--KEY VALUE`` of the trial's command. Parsed once, at the edge, into
frozen dataclasses; every error names the key, the bad value and the fix.
"""

from __future__ import annotations

import math
import numbers
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..core.errors import ConfigError

__all__ = ["Param", "SearchSpace", "parse_space", "load_space", "SpaceError", "TYPES"]

TYPES = ("float", "int", "categorical")
_KEYS = {
    "float": ({"type", "low", "high"}, {"log", "step"}),
    "int": ({"type", "low", "high"}, {"log", "step"}),
    "categorical": ({"type", "choices"}, set()),
}
_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_-]*")
_EXAMPLE = {
    "float": "{type: float, low: 1.0e-4, high: 0.1, log: true}",
    "int": "{type: int, low: 16, high: 128, step: 16}",
    "categorical": "{type: categorical, choices: [sgd, adam]}",
}


class SpaceError(ConfigError):
    """A search space that cannot be used; the message names the key and the fix."""


@dataclass(frozen=True)
class Param:
    """One searched flag: ``kind`` ``float``/``int`` (``low``..``high``, ``log``, ``step``) or
    ``categorical`` (``choices``)."""

    name: str
    kind: str
    low: float | int | None = None
    high: float | int | None = None
    log: bool = False
    step: float | int | None = None
    choices: tuple = ()

    def suggest(self, trial: Any) -> Any:
        """This parameter's value for the Optuna ``trial`` (an enqueued trial's fixed value, else sampled)."""
        if self.kind == "float":
            return trial.suggest_float(self.name, self.low, self.high, log=self.log, step=self.step)
        if self.kind == "int":
            return trial.suggest_int(self.name, self.low, self.high, log=self.log, step=self.step or 1)
        return trial.suggest_categorical(self.name, list(self.choices))

    def flag(self, value: Any) -> list[str]:
        """``["--NAME", "VALUE"]``: ``value`` as the trial's command gets it (floats in their shortest exact form)."""
        if isinstance(value, bool):
            text = "true" if value else "false"
        elif isinstance(value, float):
            text = repr(value)
        else:
            text = str(value)
        return [f"--{self.name}", text]


@dataclass(frozen=True)
class SearchSpace:
    """The parameters of a study, in the order of the YAML file."""

    params: tuple

    def names(self) -> list[str]:
        return [p.name for p in self.params]

    def suggest(self, trial: Any) -> dict[str, Any]:
        """``{name: value}`` for the Optuna ``trial``."""
        return {p.name: p.suggest(trial) for p in self.params}

    def flags(self, values: Mapping[str, Any]) -> list[str]:
        """The ``--name value`` flags for ``values`` (every parameter of the space), in space order."""
        out = []
        for p in self.params:
            out += p.flag(values[p.name])
        return out


def load_space(path: str) -> SearchSpace:
    """The SearchSpace of the YAML file ``path``. Raises SpaceError (a ConfigError) naming what is wrong."""
    import yaml

    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as e:
        raise SpaceError(
            f"--space {path!r} cannot be read ({e.strerror}); give the YAML file of the search space"
        ) from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise SpaceError(f"--space {path!r} is not valid YAML: {e}") from None
    return parse_space(data, source=path)


def parse_space(data: Any, source: str = "the search space") -> SearchSpace:
    """The SearchSpace of ``data`` (what YAML gave: ``{name: {type: ..., ...}}``). Raises SpaceError."""
    if not isinstance(data, Mapping) or not data:
        raise SpaceError(
            f"{source} must be a mapping of flag names to distributions (got {data!r}), e.g. lr: {_EXAMPLE['float']}"
        )
    params = []
    for name, spec in data.items():
        if not isinstance(name, str) or not _NAME.fullmatch(name):
            raise SpaceError(
                f"{source}: key {name!r} must be a flag name (letters, digits, '-', '_', starting with a letter); "
                "it becomes --NAME on the trial's command"
            )
        params.append(_param(name, spec, source))
    return SearchSpace(tuple(params))


def _param(name, spec, source):
    where = f"{source}: key {name!r}"
    if not isinstance(spec, Mapping):
        raise SpaceError(f"{where} must be a mapping with 'type' (got {spec!r}), e.g. {name}: {_EXAMPLE['float']}")
    kind = spec.get("type")
    if kind not in TYPES:
        raise SpaceError(
            f"{where}: 'type' must be one of {', '.join(TYPES)} (got {kind!r}), e.g. {name}: {_EXAMPLE['float']}"
        )
    required, optional = _KEYS[kind]
    missing = sorted(required - set(spec))
    unknown = sorted(str(k) for k in set(spec) - required - optional)
    if missing:
        raise SpaceError(f"{where} ({kind}) needs {', '.join(repr(k) for k in missing)}, e.g. {name}: {_EXAMPLE[kind]}")
    if unknown:
        allowed = ", ".join(sorted(required | optional))
        raise SpaceError(f"{where} ({kind}): unknown field(s) {', '.join(map(repr, unknown))}; allowed: {allowed}")
    if kind == "categorical":
        return Param(name, kind, choices=_choices(where, spec["choices"]))
    number = _float if kind == "float" else _int
    low, high = number(where, "low", spec["low"]), number(where, "high", spec["high"])
    if not low < high:
        raise SpaceError(f"{where}: 'low' must be below 'high' (got low={low!r}, high={high!r}); swap them")
    log = spec.get("log", False)
    if not isinstance(log, bool):
        raise SpaceError(f"{where}: 'log' must be true or false (got {log!r})")
    if log and low <= 0:
        raise SpaceError(f"{where}: a log scale needs 'low' > 0 (got {low!r}); raise 'low' or set log: false")
    step = spec.get("step")
    if step is not None:
        step = number(where, "step", step)
        if step <= 0:
            raise SpaceError(f"{where}: 'step' must be > 0 (got {step!r})")
        if log:
            raise SpaceError(
                f"{where}: 'step' cannot go with log: true (Optuna samples a log scale without steps); drop one"
            )
        if step > high - low:
            raise SpaceError(f"{where}: 'step' {step!r} is wider than high - low ({high - low!r}); use a smaller step")
        count = (high - low) / step
        if abs(count - round(count)) > 1e-9 * max(1.0, count):  # Optuna would cut 'high' silently
            fit = low + step * math.floor(count + 1e-9)
            raise SpaceError(
                f"{where}: high - low must be a multiple of 'step' (got low={low!r}, high={high!r}, step={step!r}); "
                f"e.g. high: {fit:.12g}"
            )
    return Param(name, kind, low=low, high=high, log=log, step=step)


def _float(where, field, value):
    if isinstance(value, str):  # YAML 1.1 reads 1e-4 (no dot) as text
        try:
            value = float(value)
        except ValueError:
            pass
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
        raise SpaceError(f"{where}: {field!r} must be a finite number (got {value!r}), e.g. {field}: 0.001")
    return float(value)


def _int(where, field, value):
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise SpaceError(
            f"{where}: {field!r} must be an integer (got {value!r}) for type int; use type: float for fractions"
        )
    return int(value)


def _choices(where, choices):
    if not isinstance(choices, Sequence) or isinstance(choices, str) or not choices:
        raise SpaceError(f"{where}: 'choices' must be a non-empty list (got {choices!r}), e.g. choices: [sgd, adam]")
    seen = []
    for c in choices:
        if c is None or not isinstance(c, (str, int, float)) or (isinstance(c, float) and not math.isfinite(c)):
            raise SpaceError(
                f"{where}: choice {c!r} must be text, an integer, a finite number or true/false; quote it as text"
            )
        if isinstance(c, str) and (not c or "\0" in c):
            raise SpaceError(f"{where}: choice {c!r} must be non-empty text without NUL characters")
        if any(type(c) is type(s) and c == s for s in seen):
            raise SpaceError(f"{where}: choice {c!r} is listed twice; list each choice once")
        seen.append(c)
    return tuple(seen)
