"""Find what in a checkpoint's data would not read back as it was saved (framework-free).

A checkpoint is read at resume, often days after it was written: a value its reader rejects (a
NumPy scalar under ``torch.load(weights_only=True)``) or changes (a tuple through JSON) makes every
checkpoint of the run useless, and nobody learns it until the resume. The adapters check at save
time with these walkers and reject such data with an error naming the key path, the type and the fix.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..errors import ConfigError

__all__ = ["first_unsupported", "unsupported_error"]

JSON_SCALARS = (type(None), bool, int, float, str)


def _type_name(value):
    kind = type(value)
    return kind.__name__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__qualname__}"


def first_unsupported(
    obj: Any,
    name: str,
    leaf_ok: Callable[[Any], bool],
    containers: tuple[type, ...] = (dict, list, tuple),
    key_ok: Callable[[Any], bool] | None = None,
) -> tuple[str, Any, str] | None:
    """``(path, value, what)`` of the first part of ``obj`` that would not read back, or None.

    Containers are walked when their type is exactly one of ``containers`` (a subclass such as a
    namedtuple or a defaultdict is checked as a leaf: readers rebuild only the plain types). Every
    other value must pass ``leaf_ok``; dict keys must pass ``key_ok`` (default: ``leaf_ok``).
    ``what`` is ``"key"`` for a bad dict key, else ``"value"``; ``path`` reads like
    ``extra['stats'][2]``.
    """
    key_ok = key_ok or leaf_ok
    seen = set()
    stack = [(name, obj)]
    while stack:
        path, value = stack.pop()
        kind = type(value)
        if kind not in containers:
            if not leaf_ok(value):
                return path, value, "value"
            continue
        if id(value) in seen:  # shared or cyclic: checked once
            continue
        seen.add(id(value))
        if isinstance(value, dict):
            items = list(value.items())
            for key, _ in items:
                if not key_ok(key):
                    return path, key, "key"
        else:
            items = list(enumerate(value))
        stack.extend((f"{path}[{key!r}]", item) for key, item in reversed(items))
    return None


def _hint(value):
    kind = type(value)
    module = kind.__module__ or ""
    if module.startswith("numpy") and hasattr(value, "item") and getattr(value, "ndim", None) == 0:
        return "convert it to a Python number with .item() (or float(x), int(x))"
    if module.startswith("numpy"):
        return "convert it with .tolist()"
    if module.startswith("pathlib"):
        return "store str(path) instead"
    if isinstance(value, tuple):
        return "use a list"
    return "store plain data instead: None, bool, int, float, str, lists and dicts of them"


def unsupported_error(found: tuple[str, Any, str], reader: str, fix: str | None = None) -> ConfigError:
    """A ConfigError for ``first_unsupported``'s finding: names the path, the type and the fix.

    ``reader`` ends the sentence "<path> is a <type>, which ..."; ``fix`` defaults to a hint for
    the type (``.item()`` for a NumPy scalar, ``str(path)`` for a path, ...).
    """
    path, value, what = found
    kind = _type_name(value)
    article = "an" if kind[0] in "aeiou" else "a"
    if what == "key":
        subject = f"{path} has the key {value!r} ({article} {kind})"
    else:
        subject = f"{path} is {article} {kind}"
    return ConfigError(f"{subject}, which {reader}; {fix or _hint(value)} (nothing was written)")
