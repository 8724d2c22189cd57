"""Loud, lazy access to torch and horovod.torch."""

from ..core.engine_import import import_engine


def horovod_torch():
    """The ``horovod.torch`` module, or MissingDependencyError saying how to get it."""
    return import_engine("torch", "PyTorch", "horovod.torch", "hvdkit.torch")
