"""State trees of a checkpoint as JSON plus named arrays, and each rank's RNG states (framework-free).

``encode`` turns plain data with tensors in it (a state dict, ``extra``) into JSON that keeps every
type: a list is ``["L", ...]``, a tuple ``["T", ...]``, a dict ``["D", [key, value], ...]`` (keys
of any scalar type), bytes ``["B", hex]``, a tensor ``["A", array name, meta]``; None, bool, int,
float and str stay as they are. The tensors go to a list, written as arrays by the caller. What
would not come back as it was (a NumPy scalar, a path, an object of another class) is refused
with an error naming its key path, its type and the fix. ``decode`` is the inverse.
"""

from __future__ import annotations

import collections
import random
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from ..data import rank_seed
from ..errors import CheckpointError
from .plain_data import unsupported_error

__all__ = ["encode", "decode", "capture_rng", "restore_rng", "reseed_rng"]

_SCALARS = (type(None), bool, int, float, str)
_DICTS = (dict, collections.OrderedDict)  # a state dict is an OrderedDict; other subclasses are refused
_READER = "a checkpoint cannot give back as it was"


def encode(
    obj: Any,
    name: str,
    found: list[tuple[str, Any]],
    is_tensor: Callable[[Any], bool],
    describe: Callable[[Any], Any] = lambda t: None,
) -> Any:
    """``obj`` as JSON-ready data; its tensors are appended to ``found`` as ``(array name, tensor)``.

    Array names are ``<name>/<n>``; ``describe(tensor)`` gives what ``decode``'s ``load`` needs
    besides the array (a dtype NumPy lacks, say), or None. Raises ConfigError naming the key path
    (``extra['stats'][2]``) and type of the first value that would not come back as it was.
    """
    count = [0]

    def walk(value, path):
        kind = type(value)
        if kind in _SCALARS:
            return value
        if is_tensor(value):
            array = f"{name}/{count[0]}"
            count[0] += 1
            found.append((array, value))
            return ["A", array, describe(value)]
        if kind is bytes:
            return ["B", value.hex()]
        if kind in (list, tuple):
            return ["L" if kind is list else "T", *(walk(v, f"{path}[{i}]") for i, v in enumerate(value))]
        if kind in _DICTS:
            items = []
            for key, v in value.items():
                if type(key) not in _SCALARS:
                    raise unsupported_error(
                        (path, key, "key"), _READER, "use keys that are None, bool, int, float or str"
                    )
                items.append([key, walk(v, f"{path}[{key!r}]")])
            return ["D", *items]
        raise unsupported_error((path, value, "value"), _READER)

    return walk(obj, name)


def decode(tree: Any, load: Callable[[str, Any], Any]) -> Any:
    """The data ``encode`` turned into ``tree``; ``load(array name, meta)`` gives each tensor back."""
    if not isinstance(tree, list):
        return tree
    if not tree:
        raise CheckpointError("a checkpoint's state tree holds an empty list (corrupted)")
    tag, *rest = tree
    if tag == "L":
        return [decode(v, load) for v in rest]
    if tag == "T":
        return tuple(decode(v, load) for v in rest)
    if tag == "D":
        return {key: decode(v, load) for key, v in rest}
    if tag == "A":
        return load(rest[0], rest[1])
    if tag == "B":
        return bytes.fromhex(rest[0])
    raise CheckpointError(f"a checkpoint's state tree holds an unknown tag {tag!r} (written by a newer hvdkit?)")


def capture_rng(framework: Any) -> dict[str, Any]:
    """This process's RNG states: Python's ``random``, NumPy's global RNG and ``framework``'s (arrays)."""
    version, internal, gauss = random.getstate()
    name, keys, pos, has_gauss, cached = np.random.get_state()
    return {
        "python": [version, np.array(internal, dtype=np.uint32), gauss],
        "numpy": [name, np.asarray(keys, dtype=np.uint32), int(pos), int(has_gauss), float(cached)],
        "framework": framework,
    }


def restore_rng(state: Mapping[str, Any]) -> Any:
    """Set Python's and NumPy's RNG states from ``capture_rng``'s ``state``; returns its ``framework`` part."""
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(int(x) for x in internal), gauss))
    name, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((name, np.asarray(keys, dtype=np.uint32), pos, has_gauss, cached))
    return state["framework"]


def reseed_rng(seed: int, step: int, rank: int) -> int:
    """Seed Python's and NumPy's RNGs from ``(seed, step, rank)`` alone; returns the seed used.

    Used at a resume with another world size, where the saved per-rank states cannot carry over
    (``hvdkit.core.data.rank_seed``); the adapter seeds its framework with the same value.
    """
    value = rank_seed(seed, step, rank)
    random.seed(value)
    np.random.seed(value & 0xFFFFFFFF)
    return value
