"""hvdkit: Horovod/MPI training for today's PyTorch and TensorFlow/Keras.

``import hvdkit`` is cheap and framework-free; ``import hvdkit.torch`` loads torch and Horovod.
"""

__version__ = "0.1.0"

from . import _deprecated

_deprecated.install()  # the module paths that moved in 0.2 still import, warning, until 0.3
