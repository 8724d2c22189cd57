"""At save time, whether ``torch.load(weights_only=True)`` will read a checkpoint's state back.

Checkpoints are read with ``weights_only=True`` (it runs no pickled code), which refuses NumPy
scalars and arrays, paths and objects of other classes. ``torch.save`` writes them without a word,
so without this check such a value in ``extra`` or a state dict makes every checkpoint of the run
unloadable, and nobody learns it until the resume.
"""

import collections
import io

import torch

from ..core.plain_data import first_unsupported, unsupported_error

__all__ = ["check_loadable"]

_PLAIN = frozenset({type(None), bool, int, float, complex, str, bytes, torch.Tensor, torch.nn.Parameter})
_CONTAINERS = (dict, list, tuple, collections.OrderedDict)
_READER = "torch.load(weights_only=True) refuses when the checkpoint is read at resume"


def _reads_back(value):
    if type(value) in _PLAIN:
        return True
    buf = io.BytesIO()  # anything else: ask the reader itself (dtypes, devices, torch.Size, ...)
    try:
        torch.save(value, buf)
        buf.seek(0)
        torch.load(buf, weights_only=True)
    except Exception:  # noqa: BLE001 - whatever the reason, it would not load
        return False
    return True


def check_loadable(value, name):
    """Raise ConfigError naming the key path and type of the first part of ``value`` (called
    ``name``) that ``torch.load(weights_only=True)`` would not read back."""
    found = first_unsupported(value, name, _reads_back, containers=_CONTAINERS)
    if found:
        raise unsupported_error(found, _READER)
