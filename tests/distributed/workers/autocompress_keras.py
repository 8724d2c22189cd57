"""Runs on every rank of a real 2-rank Keras job: compression="auto" in the optimizer and the tape.

Writes OUT/rank<r>.json. Each run logs (rank 0 only) what auto chose; the logged lines are
broadcast so every rank can check its training against them: "none" must equal one process on the
global batch to 1e-6, "fp16" must differ from it. The tape runs inside a tf.function (auto decides
while it is traced).
Usage: python autocompress_keras.py OUT
"""

import sys
from functools import partial

import horovod.tensorflow as hvd
import keras
import numpy as np
import tensorflow as tf
from model_params import keras_clone, keras_mlp, max_weight_diff, weights_digest
from recording import error_of, logged_runs, with_env, write_rank_result

import hvdkit.keras as hk
import hvdkit.tensorflow as htf
from hvdkit.tensorflow.autocompress import measure_and_choose

STEPS, B, LR = 3, 4, 0.1
VAR = "HVDKIT_COMPRESSION"


def make_model(seed=0):
    return keras_mlp(seed, hidden=(64,))


def clone(model):
    return keras_clone(model, hidden=(64,))


def global_data(size):
    g = np.random.RandomState(7)
    return g.randn(STEPS, size * B, 8).astype("float32"), g.randn(STEPS, size * B, 4).astype("float32")


def rank_rows(a, rank):
    return np.concatenate([step[rank * B : (rank + 1) * B] for step in a])


def reference(init, x, y):
    model = clone(init)
    model.compile(optimizer=keras.optimizers.SGD(LR), loss="mse")
    model.fit(x.reshape(-1, 8), y.reshape(-1, 4), batch_size=x.shape[1], shuffle=False, verbose=0)
    return model


def fit(init, x, y, rank, compression):
    model = clone(init)
    model.compile(optimizer=hk.DistributedOptimizer(keras.optimizers.SGD(LR), compression=compression), loss="mse")
    model.fit(rank_rows(x, rank), rank_rows(y, rank), batch_size=B, shuffle=False, verbose=0)
    return model


def tape(init, x, y, rank, compression):
    model = clone(init)
    opt = keras.optimizers.SGD(LR)

    @tf.function
    def step(xb, yb):
        with tf.GradientTape() as t:
            loss = tf.reduce_mean(tf.square(model(xb) - yb))
        grads = htf.DistributedGradientTape(t, compression=compression).gradient(loss, model.trainable_variables)
        opt.apply(grads, model.trainable_variables)

    for s in range(STEPS):
        step(tf.constant(x[s][rank * B : (rank + 1) * B]), tf.constant(y[s][rank * B : (rank + 1) * B]))
    return model


RUNS = [  # (label, train function, compression argument, HVDKIT_COMPRESSION)
    ("fit_auto", fit, "auto", None),
    ("fit_auto_env_fp16", fit, "auto", "fp16"),
    ("fit_auto_env_none", fit, "auto", "none"),
    ("fit_explicit_none_env_fp16", fit, "none", "fp16"),
    ("fit_explicit_fp16", fit, "fp16", None),
    ("tape_auto", tape, "auto", None),
    ("tape_explicit_none", tape, "none", None),
    ("tape_explicit_fp16", tape, "fp16", None),
]


def main(out_dir):
    topo = hk.init(threads=1)
    init = make_model()
    x, y = global_data(topo.size)
    ref = reference(init, x, y)
    out = {"rank": topo.rank, "measured": measure_and_choose(init.trainable_variables).as_dict()}
    runs = [
        (label, partial(with_env, VAR, env, partial(train, init, x, y, topo.rank, arg)))
        for label, train, arg, env in RUNS
    ]
    rank0_view = partial(hvd.broadcast_object, root_rank=0, name="test.autocompress.logged")
    out["runs"] = logged_runs(
        "hvdkit.autocompress",
        runs,
        rank0_view,
        lambda model: {"digest": weights_digest(model), "max_diff_vs_reference": max_weight_diff(model, ref)},
    )
    out["errors"] = {
        "optimizer": error_of(
            lambda: hk.DistributedOptimizer(keras.optimizers.SGD(LR), compression="int8"), ValueError
        ),
        "tape": error_of(lambda: htf.DistributedGradientTape(tf.GradientTape(), compression="bf16"), ValueError),
        "variable": with_env(VAR, "half", lambda: error_of(lambda: fit(init, x, y, topo.rank, "auto"), ValueError)),
    }
    write_rank_result(out_dir, topo.rank, out)


if __name__ == "__main__":
    main(sys.argv[1])
