"""Loud, lazy access to torch and horovod.torch."""

from ..core.errors import MissingDependencyError

_FIX = "run `make setup` (it builds Horovod against the pinned torch), or see README.md"


def horovod_torch():
    """The ``horovod.torch`` module, or MissingDependencyError saying how to get it."""
    try:
        import torch  # noqa: F401
    except ImportError as e:
        raise MissingDependencyError(f"hvdkit.torch needs PyTorch ({e}); {_FIX}") from e
    try:
        import horovod.torch as hvd
    except ImportError as e:
        raise MissingDependencyError(
            f"Horovod with PyTorch support is not importable ({e}); it must be built against the installed "
            f"torch: {_FIX}"
        ) from e
    return hvd
