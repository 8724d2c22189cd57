"""hvdkit: Horovod/MPI training for today's PyTorch and TensorFlow/Keras.

``import hvdkit`` is cheap and framework-free; ``import hvdkit.torch`` loads torch and Horovod.
"""

__version__ = "0.2.0"  # the release whose moved paths hvdkit._deprecated serves (MOVED_IN)

from . import _deprecated

_deprecated.install()  # the module paths that moved in 0.2 still import, warning, until 0.3
