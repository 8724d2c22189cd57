"""Runs on every rank of a real 2-rank job; writes what it observed to OUT/rank<r>.json.

TensorFlow restore sends every variable in chunks: here the chunk is shrunk to 1,000 bytes so that
every variable of a small Keras model (odd sizes, float32 and the optimizer's int64 counter) spans
several chunks and ends mid-chunk. Then the same through a background save (``async_save=True``)
whose write is held (write_gate) while the model trains on: the state at save time comes back.
The pytest side is tests/distributed/test_restore_tf.py.
Usage: python restore_tf.py OUT
"""

import hashlib
import os
import sys

import keras
import numpy as np
from recording import error_of, write_rank_result
from write_gate import hold_writes

import hvdkit.tensorflow as htf
import hvdkit.tensorflow.comm as tf_comm
from hvdkit.core import CheckpointError

tf_comm.CHUNK_BYTES = 1000


def make_model(seed, width=37):
    keras.utils.set_random_seed(seed)
    model = keras.Sequential([keras.Input((29,)), keras.layers.Dense(width, activation="tanh"), keras.layers.Dense(3)])
    model.compile(optimizer=keras.optimizers.SGD(0.1, momentum=0.9), loss="mse")
    return model


def digest(model):
    h = hashlib.sha256()
    for v in [*model.weights, *model.optimizer.variables]:
        h.update(np.ascontiguousarray(v.numpy()).tobytes())
    return h.hexdigest()


def main(out_dir):
    topo = htf.init()
    ckpt_dir = os.path.join(out_dir, "ckpt")
    model = make_model(seed=0)
    x = np.linspace(-1, 1, 8 * 29, dtype="float32").reshape(8, 29)
    model.fit(x, x[:, :3], batch_size=8, epochs=2, verbose=0)  # every rank alike: momentum and iterations set
    htf.Checkpointer(ckpt_dir, model, model.optimizer).save(step=2, epoch=2, extra={"k": 1})
    fresh = make_model(seed=10 + topo.rank)  # other weights, and an optimizer that never stepped
    before = digest(fresh)
    resumed = htf.Checkpointer(ckpt_dir, fresh, fresh.optimizer).restore()
    other = make_model(seed=0, width=37 if topo.rank == 0 else 38)  # rank 1 builds another model
    result = {
        "rank": topo.rank,
        "saved": digest(model),
        "before": before,
        "restored": digest(fresh),
        "resumed": [resumed.step, resumed.epoch, resumed.extra],
        "iterations": int(fresh.optimizer.iterations),
        "mismatch_error": error_of(
            lambda: htf.Checkpointer(ckpt_dir, other, other.optimizer).restore(), CheckpointError
        ),
    }
    result["async"] = async_save(out_dir, topo.rank, model, x)
    write_rank_result(out_dir, topo.rank, result)


def async_save(out_dir, rank, model, x):
    """The model saved with async_save, its write held until it trained on; what a restore gives back."""
    gate = hold_writes()
    ckpt_dir = os.path.join(out_dir, "ckpt-async")
    ckpt = htf.Checkpointer(ckpt_dir, model, model.optimizer, async_save=True)
    saved = digest(model)
    gate.clear()
    path = ckpt.save(step=2, epoch=2, extra={"k": 1})
    model.fit(x, x[:, :3], batch_size=8, epochs=1, verbose=0)  # the variables change while the write waits
    moved = digest(model) != saved
    gate.set()
    written = ckpt.wait()
    fresh = make_model(seed=20 + rank)
    resumed = htf.Checkpointer(ckpt_dir, fresh, fresh.optimizer).restore()
    return {
        "saved": saved,
        "moved_on": moved,
        "same_path": path == written,
        "restored": digest(fresh),
        "resumed": [resumed.step, resumed.epoch, resumed.extra],
    }


if __name__ == "__main__":
    main(sys.argv[1])
