"""Runs on every rank of a real 2-rank Keras job: ``mixed_float16`` with 2 accumulated batches a step, and one
rank's gradients non-finite in one batch of one optimizer step.

The model, ``hk.DistributedOptimizer`` and ``model.fit`` are the real ones; the overflow comes from the data: in the
second batch of optimizer step ``SKIPPED`` rank 1 feeds one input value past float16's largest (65504), which the
first layer casts to inf, so that rank's gradients of that batch hold infs and NaNs. Rank 0's batches are all
finite (each rank also records whether its own gradients of that step's batches are, at the weights the step
started from). After every batch it records the loss scale, its count of good steps, the optimizer step count,
Keras's raw batch counter, whether the gradient accumulators are all zero, and a digest of the weights and of the
momentum. Then the same start trains on the same data less that step's batches (the run the skipped step should
leave behind). Writes OUT/rank<r>.json.
Usage: python keras_amp_overflow.py OUT
"""

import hashlib
import sys

import keras
import numpy as np
import tensorflow as tf
from model_params import keras_mlp, weights_digest, weights_of
from recording import write_rank_result

import hvdkit.keras as hk

STEPS, K, B = 5, 2, 4  # optimizer steps, batches accumulated a step, samples a batch on each rank
SKIPPED, OVERFLOWING_RANK = 2, 1  # the step whose second batch overflows, on that rank only
SCALE, GROWTH = 2.0**10, 2  # the dynamic loss scale doubles after 2 good steps
HUGE = 1.0e5  # float16's largest finite value is 65504


def _raw(opt):
    return next(v for v in opt.inner_optimizer.variables if v.name == "iteration")


def _accumulators(opt):
    return [v for v in opt.inner_optimizer.variables if v.name.endswith("_gradient_accumulator")]


def _momentum_digest(opt):
    values = [np.ravel(v.numpy()).astype(np.float64) for v in opt.inner_optimizer.variables if "momentum" in v.name]
    return hashlib.sha256(np.concatenate(values).tobytes()).hexdigest()


class _Record(keras.callbacks.Callback):
    """What the loss-scale optimizer holds after each batch (read between two batches of ``fit``)."""

    def __init__(self):
        super().__init__()
        self.batches = []
        self.before_skipped = None  # the weights the skipped step starts from

    def on_train_batch_end(self, batch, logs=None):
        opt = self.model.optimizer
        if batch == SKIPPED * K - 1:
            self.before_skipped = self.model.get_weights()
        self.batches.append(
            {
                "scale": float(opt.dynamic_scale.numpy()),
                "good": int(opt.step_counter.numpy()),
                "iterations": int(opt.iterations.numpy()),
                "raw": int(_raw(opt).numpy()),
                "accumulators_zero": all(bool(np.all(a.numpy() == 0)) for a in _accumulators(opt)),
                "weights": weights_digest(self.model),
                "momentum": _momentum_digest(opt),
            }
        )


def _own_gradients_finite(weights, x, y, scale):
    """Whether this rank's own scaled gradients of each batch ``x[b], y[b]`` are finite at ``weights`` (no collective)."""
    model = keras_mlp(0, hidden=(16,))
    model.set_weights(weights)
    finite = []
    for xb, yb in zip(x, y, strict=True):
        with tf.GradientTape() as tape:
            loss = keras.ops.mean(keras.ops.square(yb - keras.ops.cast(model(xb), "float32"))) * scale
        grads = tape.gradient(loss, model.trainable_variables)
        finite.append(all(bool(np.all(np.isfinite(g.numpy()))) for g in grads))
    return finite


def _train(init, x, y, record=None):
    model = keras_mlp(0, hidden=(16,))
    model.set_weights(init.get_weights())
    scaled = keras.optimizers.LossScaleOptimizer(
        keras.optimizers.SGD(0.05, momentum=0.9), initial_scale=SCALE, dynamic_growth_steps=GROWTH
    )
    model.compile(optimizer=hk.DistributedOptimizer(scaled, backward_passes_per_step=K), loss="mse")
    model.fit(x, y, batch_size=B, shuffle=False, verbose=0, callbacks=[record] if record else [])
    return model


def main(out_dir):
    topo = hk.init()
    keras.mixed_precision.set_global_policy("mixed_float16")  # the pool puts float32 back after the case
    g = np.random.RandomState(5)
    x = g.randn(STEPS * K, topo.size, B, 8).astype("float32")
    y = g.randn(STEPS * K, topo.size, B, 4).astype("float32")
    x, y = x[:, topo.rank], y[:, topo.rank]  # this rank's batches, (batch, sample, feature)
    overflowing = SKIPPED * K + K - 1  # the step's last batch
    if topo.rank == OVERFLOWING_RANK:
        x[overflowing, 0, 0] = HUGE
    init = keras_mlp(0, hidden=(16,))
    record = _Record()
    model = _train(init, x.reshape(-1, 8), y.reshape(-1, 4), record)
    step = slice(SKIPPED * K, SKIPPED * K + K)
    own = _own_gradients_finite(record.before_skipped, x[step], y[step], record.batches[SKIPPED * K - 1]["scale"])
    kept = [b for b in range(STEPS * K) if b // K != SKIPPED]
    reference = _train(init, x[kept].reshape(-1, 8), y[kept].reshape(-1, 4))
    write_rank_result(
        out_dir,
        topo.rank,
        {
            "rank": topo.rank,
            "size": topo.size,
            "overflowing_batch": overflowing,
            "policy": model.layers[0].dtype_policy.name,
            "batches": record.batches,
            "own_gradients_finite": own,
            "final": weights_digest(model),
            "final_finite": bool(np.all(np.isfinite(weights_of(model)))),
            "moved": float(np.max(np.abs(weights_of(model) - weights_of(init)))),
            "reference": weights_digest(reference),
            "max_diff_vs_reference": float(np.max(np.abs(weights_of(model) - weights_of(reference)))),
        },
    )


if __name__ == "__main__":
    main(sys.argv[1])
