"""Loud, lazy access to TensorFlow and horovod.tensorflow."""

import os

from ..core.errors import MissingDependencyError

_FIX = "run `make setup` (it builds Horovod against the pinned TensorFlow), or see README.md"


def horovod_tf():
    """The ``horovod.tensorflow`` module, or MissingDependencyError saying how to get it."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # TensorFlow's start-up chatter, once per rank
    try:
        import tensorflow  # noqa: F401
    except ImportError as e:
        raise MissingDependencyError(f"hvdkit.tensorflow needs TensorFlow ({e}); {_FIX}") from e
    try:
        import horovod.tensorflow as hvd
    except ImportError as e:
        raise MissingDependencyError(
            f"Horovod with TensorFlow support is not importable ({e}); it must be built against the installed "
            f"TensorFlow: {_FIX}"
        ) from e
    return hvd


def compression(name):
    """Horovod's TensorFlow compressor for an hvdkit compression name (already checked)."""
    hvd = horovod_tf()
    return hvd.Compression.fp16 if name == "fp16" else hvd.Compression.none
