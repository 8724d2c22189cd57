"""Loud, lazy access to TensorFlow and horovod.tensorflow."""

import os

from ..core.engine_import import import_engine


def horovod_tf():
    """The ``horovod.tensorflow`` module, or MissingDependencyError saying how to get it."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # TensorFlow's start-up chatter, once per rank
    return import_engine("tensorflow", "TensorFlow", "horovod.tensorflow", "hvdkit.tensorflow")


def compression(name):
    """Horovod's TensorFlow compressor for an hvdkit compression name (already checked)."""
    hvd = horovod_tf()
    return hvd.Compression.fp16 if name == "fp16" else hvd.Compression.none
