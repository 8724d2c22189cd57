"""hvdkit for TensorFlow: custom training loops over ``horovod.tensorflow``.

    import hvdkit.tensorflow as htf
    htf.init()
    with tf.GradientTape() as tape:
        loss = loss_fn(model(x), y)
    grads = htf.DistributedGradientTape(tape, compression="fp16").gradient(loss, model.trainable_variables)

Keras ``fit`` users: ``hvdkit.keras``. Importing this module loads TensorFlow and Horovod.
"""

from ._engine import horovod_tf

horovod_tf()  # fail here, loudly, when TensorFlow or Horovod's TensorFlow support is missing

# These imports come after that check (E402). The runtime's names (its __all__, star-imported) are
# exported through `*_RUNTIME` in `__all__`.
from ..core.metrics import MetricTracker  # noqa: E402
from .checkpoint import Checkpointer, Resumed  # noqa: E402
from .data import batch_plan, epoch_dataset, shard  # noqa: E402
from .gradients import DistributedGradientTape, allreduce_gradients  # noqa: E402
from .monitoring import Tracker  # noqa: E402
from .runtime import *  # noqa: E402, F403 - exactly its __all__, re-exported through _RUNTIME
from .runtime import __all__ as _RUNTIME  # noqa: E402
from .variables import broadcast_variables  # noqa: E402

# Names and the concepts they share with hvdkit.torch and hvdkit.keras: docs/api/names.md.
__all__ = [  # and the runtime's: init, rank, size, PreemptionGuard, ... (hvdkit.tensorflow.runtime)
    *_RUNTIME,
    "Checkpointer",
    "DistributedGradientTape",
    "MetricTracker",
    "Resumed",
    "Tracker",
    "allreduce_gradients",
    "batch_plan",
    "broadcast_variables",
    "epoch_dataset",
    "shard",
]
