"""Runs on every rank of a real 2-rank Keras job: clipping after averaging, and the scaled LR schedules.

Writes OUT/rank<r>.json. References are 1-process runs computed on each rank without collectives.
Usage: python lr_clipping_keras.py OUT
"""

import sys

import keras
import numpy as np
import tensorflow as tf
from lr_clipping_setup import LR, MAX_NORM, B
from model_params import keras_clone, keras_mlp
from model_params import max_weight_diff as max_diff
from model_params import weights_digest as digest
from recording import run_sections

import hvdkit.keras as hk
import hvdkit.tensorflow as htf

STEPS = 4


def make_model(seed=0):
    return keras_mlp(seed)


def clone(model):
    return keras_clone(model)


def global_data(size):
    g = np.random.RandomState(1234)
    # targets far from the outputs: large gradients, so clipping matters
    return g.randn(STEPS, size * B, 8).astype("float32"), 5 * g.randn(STEPS, size * B, 4).astype("float32")


def rank_rows(a, rank):
    return np.concatenate([step[rank * B : (rank + 1) * B] for step in a])


def grads_of(model, xb, yb):
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(tf.square(model(xb) - yb))
    return tape.gradient(loss, model.trainable_variables)


def reference_fit(init, x, y):
    """1 process, batch size*B, the optimizer's own global_clipnorm."""
    model = clone(init)
    model.compile(optimizer=keras.optimizers.SGD(LR, momentum=0.9, global_clipnorm=MAX_NORM), loss="mse")
    model.fit(x.reshape(-1, 8), y.reshape(-1, 4), batch_size=x.shape[1], shuffle=False, verbose=0)
    return model


def per_rank_clip(init, x, y, size):
    """What clipping each rank's gradient before averaging would give (1 process, no collectives)."""
    model = clone(init)
    opt = keras.optimizers.SGD(LR, momentum=0.9)
    for s in range(STEPS):
        parts = [
            tf.clip_by_global_norm(grads_of(model, x[s][r * B : (r + 1) * B], y[s][r * B : (r + 1) * B]), MAX_NORM)[0]
            for r in range(size)
        ]
        opt.apply([sum(gs) / size for gs in zip(*parts)], model.trainable_variables)
    return model


def tape_loop(init, x, y, rank, clip_in_optimizer, compiled):
    model = clone(init)
    opt = keras.optimizers.SGD(LR, momentum=0.9, global_clipnorm=MAX_NORM if clip_in_optimizer else None)

    def step(xb, yb):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(model(xb) - yb))
        grads = htf.DistributedGradientTape(tape).gradient(loss, model.trainable_variables)
        if not clip_in_optimizer:  # the documented recipe: clip what the tape returns
            grads, _ = tf.clip_by_global_norm(grads, MAX_NORM)
        opt.apply(grads, model.trainable_variables)

    step = tf.function(step) if compiled else step
    for s in range(STEPS):
        step(tf.constant(x[s][rank * B : (rank + 1) * B]), tf.constant(y[s][rank * B : (rank + 1) * B]))
    return model


def section_clipping(rank, size):
    x, y = global_data(size)
    init = make_model(seed=0)
    ref = reference_fit(init, x, y)
    out = {"first_norm": float(tf.linalg.global_norm(grads_of(init, x[0], y[0]))), "moved": max_diff(ref, init)}
    model = clone(init)
    opt = hk.DistributedOptimizer(keras.optimizers.SGD(LR, momentum=0.9, global_clipnorm=MAX_NORM))
    model.compile(optimizer=opt, loss="mse")
    model.fit(rank_rows(x, rank), rank_rows(y, rank), batch_size=B, shuffle=False, verbose=0)
    out["fit_global_clipnorm"] = {"digest": digest(model), "max_diff_vs_reference": max_diff(model, ref)}
    for name, in_opt, compiled in [("tape_clip_by_global_norm", False, False), ("tape_optimizer_clipnorm", True, True)]:
        model = tape_loop(init, x, y, rank, in_opt, compiled)
        out[name] = {"digest": digest(model), "max_diff_vs_reference": max_diff(model, ref)}
    out["per_rank_clip_diff"] = max_diff(per_rank_clip(init, x, y, size), ref)
    return out


def fit_recording_lr(optimizer, callbacks, rank, epochs, passes=1):
    """The rate each optimizer step of ``fit`` applies (read before the batch that completes the step)."""
    model = make_model(0)
    model.compile(optimizer=hk.DistributedOptimizer(optimizer, backward_passes_per_step=passes), loss="mse")
    lrs = []

    def on_batch(b, logs):
        if (b + 1) % passes == 0:
            lrs.append(float(model.optimizer.learning_rate))

    record = keras.callbacks.LambdaCallback(on_train_batch_begin=on_batch)
    g = np.random.RandomState(rank)
    model.fit(
        g.randn(4 * B, 8).astype("float32"),
        g.randn(4 * B, 4).astype("float32"),
        batch_size=B,
        epochs=epochs,
        shuffle=False,
        verbose=0,
        callbacks=[hk.BroadcastInitialStateCallback(), *callbacks, record],
    )
    return lrs


def section_lr(rank, size):
    out = {"scaled_lr": {rule: hk.scaled_lr(LR, rule) for rule in ("linear", "sqrt", "none")}}
    for rule in ("linear", "sqrt"):
        warm = hk.LearningRateWarmupCallback(initial_lr=LR, warmup_epochs=1, rule=rule)
        out[f"warmup_callback_{rule}"] = fit_recording_lr(keras.optimizers.SGD(LR), [warm], rank, epochs=2)
        sched = hk.ScaledLRSchedule(LR, rule=rule, warmup_steps=4)
        out[f"schedule_{rule}"] = fit_recording_lr(keras.optimizers.SGD(sched), [], rank, epochs=2)
    sched = hk.ScaledLRSchedule(keras.optimizers.schedules.ExponentialDecay(LR, 1, 0.5), "linear", warmup_steps=4)
    out["schedule_accumulation_2"] = fit_recording_lr(keras.optimizers.SGD(sched), [], rank, epochs=2, passes=2)
    return out


def main(out_dir):
    run_sections(hk.init, out_dir, clipping=section_clipping, lr=section_lr)


if __name__ == "__main__":
    main(sys.argv[1])
