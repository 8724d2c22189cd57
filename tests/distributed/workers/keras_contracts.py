"""Runs on every rank of a real 2-rank job; writes what it observed to OUT/rank<r>.json.

The pytest side (tests/distributed/test_keras_contracts.py) asserts on those files. Inputs are
deterministic; references are 1-process runs computed on each rank without any collective.
Usage: python keras_contracts.py OUT
"""

import os
import sys

import keras
import numpy as np
import tensorflow as tf
from model_params import keras_clone, keras_mlp, weights_of
from model_params import max_weight_diff as max_diff
from model_params import weights_digest as digest
from recording import error_of, write_sections

import hvdkit.keras as hk
import hvdkit.tensorflow as htf
from hvdkit.core import CheckpointError, CollectiveError, ConfigError

STEPS = 4
B = 4  # per-rank batch
LR = 0.1
MIXED_OVERFLOW_STEP = 1  # section_mixed_precision: the step whose gradients overflow on rank 1 only


def make_model(seed):
    return keras_mlp(seed)


def clone(model):
    return keras_clone(model)


def global_data(size, steps=STEPS, per_rank=B):
    g = np.random.RandomState(1234)
    x = g.randn(steps, size * per_rank, 8).astype("float32")
    y = g.randn(steps, size * per_rank, 4).astype("float32")
    return x, y


def rank_rows(a, rank, per_rank=B):
    """Rank r's part of every global batch, in step order: its own, rank-dependent data."""
    return np.concatenate([step[rank * per_rank : (rank + 1) * per_rank] for step in a])


def reference_fit(init, x, y, batch):
    model = clone(init)
    model.compile(optimizer=keras.optimizers.SGD(LR, momentum=0.9), loss="mse")
    model.fit(x.reshape(-1, 8), y.reshape(-1, 4), batch_size=batch, shuffle=False, verbose=0)
    return model


def section_fit(rank, size):
    x, y = global_data(size)
    init = make_model(seed=rank)  # different on purpose: BroadcastInitialStateCallback must fix it
    hk.broadcast_variables(init.weights)
    out = {"init_digest": digest(init)}
    ref = reference_fit(init, x, y, batch=size * B)
    for name, kwargs in {"fp32": {}, "fp16": {"compression": "fp16"}}.items():
        model = clone(init)
        model.compile(optimizer=hk.DistributedOptimizer(keras.optimizers.SGD(LR, momentum=0.9), **kwargs), loss="mse")
        model.fit(
            rank_rows(x, rank),
            rank_rows(y, rank),
            batch_size=B,
            shuffle=False,
            verbose=0,
            callbacks=[hk.BroadcastInitialStateCallback()],
        )
        out[name] = {"digest": digest(model), "max_diff_vs_reference": max_diff(model, ref)}
        if name == "fp32":
            hvdkit_fp32 = model
    # Horovod's own Keras optimizer, used the same way. Upstream 0.28.1 does not average under Keras 3
    # (the ranks drift apart); the engine hvdkit installs carries the fix (hvdkit/engine/recipe/horovod-fixes/4*).
    import horovod.tensorflow.keras as hvd_keras

    model = clone(init)
    model.compile(optimizer=hvd_keras.DistributedOptimizer(keras.optimizers.SGD(LR, momentum=0.9)), loss="mse")
    model.fit(rank_rows(x, rank), rank_rows(y, rank), batch_size=B, shuffle=False, verbose=0)
    out["horovod_keras"] = {
        "digest": digest(model),
        "max_diff_vs_reference": max_diff(model, ref),
        "max_diff_vs_hvdkit_fp32": max_diff(model, hvdkit_fp32),
    }
    # What a wrong reduction would give: only this rank's half of every batch.
    out["wrong_missing_rank_diff"] = max_diff(reference_fit(init, x[:, :B], y[:, :B], batch=B), ref)
    out["moved"] = max_diff(ref, init)
    return out


def section_accumulation(rank, size):
    # backward_passes_per_step=2: each update averages 2 local batches of B and both ranks:
    # the same as 1 process with batch 2 * size * B, when the global batches are laid out so.
    x, y = global_data(size, steps=2 * STEPS)
    init = make_model(seed=0)
    ref = reference_fit(init, x.reshape(STEPS, 2 * size * B, 8), y.reshape(STEPS, 2 * size * B, 4), batch=2 * size * B)
    model = clone(init)
    opt = hk.DistributedOptimizer(keras.optimizers.SGD(LR, momentum=0.9), backward_passes_per_step=2)
    model.compile(optimizer=opt, loss="mse")
    # micro-batch k of update s is global rows [(2s + k) * size * B ...]; this rank's part of each
    model.fit(rank_rows(x, rank), rank_rows(y, rank), batch_size=B, shuffle=False, verbose=0)
    return {"digest": digest(model), "max_diff_vs_reference": max_diff(model, ref)}


def section_custom_loop(rank, size):
    x, y = global_data(size)
    init = make_model(seed=0)
    ref = reference_fit(init, x, y, batch=size * B)
    out = {}
    for name, compression, compiled, use_optimizer in [
        ("tape_eager", "none", False, False),
        ("tape_function", "none", True, False),
        ("tape_fp16_eager", "fp16", False, False),
        ("tape_fp16_function", "fp16", True, False),
        ("optimizer_eager", "none", False, True),
        ("optimizer_function", "none", True, True),
    ]:
        model = clone(init)
        if use_optimizer:
            opt = hk.DistributedOptimizer(keras.optimizers.SGD(LR, momentum=0.9), compression=compression)
        else:
            opt = keras.optimizers.SGD(LR, momentum=0.9)

        def step(xb, yb, model=model, opt=opt, compression=compression, use_optimizer=use_optimizer):
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean(tf.square(model(xb) - yb))
            if not use_optimizer:
                tape = htf.DistributedGradientTape(tape, compression=compression)
            grads = tape.gradient(loss, model.trainable_variables)
            opt.apply_gradients(zip(grads, model.trainable_variables))

        if compiled:
            step = tf.function(step)
        mine = slice(rank * B, (rank + 1) * B)
        for s in range(STEPS):
            step(tf.constant(x[s][mine]), tf.constant(y[s][mine]))
        out[name] = {"digest": digest(model), "max_diff_vs_reference": max_diff(model, ref)}
    return out


def section_metrics(rank, size):
    # 10 samples, uneven shards: rank 0 holds 7, rank 1 holds 3.
    g = np.random.RandomState(7)
    x_all = g.randn(10, 8).astype("float32")
    y_all = g.randint(0, 4, size=10)
    mine = slice(0, 7) if rank == 0 else slice(7, 10)
    model = make_model(0)
    model.compile(
        optimizer=hk.DistributedOptimizer(keras.optimizers.SGD(0.0)),
        loss="sparse_categorical_crossentropy",
        metrics=["accuracy"],
    )
    # the truth: one process over all 10 samples (no collectives)
    expect = model.evaluate(x_all, y_all, batch_size=10, verbose=0, return_dict=True)
    n = 7 if rank == 0 else 3  # one step per rank: the same number of steps on both
    hist = model.fit(
        x_all[mine],
        y_all[mine],
        batch_size=n,
        epochs=1,
        shuffle=False,
        verbose=0,
        validation_data=(x_all[mine], y_all[mine]),
        validation_batch_size=n,
        callbacks=[hk.MetricAverageCallback()],
    )
    model.evaluate(x_all[mine], y_all[mine], batch_size=n, verbose=0)
    after_evaluate = hk.average_model_metrics(model)
    local_only = model.evaluate(x_all[mine], y_all[mine], batch_size=n, verbose=0, return_dict=True)
    return {
        "expect": {k: float(v) for k, v in expect.items()},
        "fit_logs": {k: float(v[0]) for k, v in hist.history.items()},
        "after_evaluate": after_evaluate,
        "local_only": {k: float(v) for k, v in local_only.items()},
    }


def section_checkpoint_and_warmup(rank, size, out_dir):
    ckpt_dir = os.path.join(out_dir, f"ckpt-of-rank{rank}")  # rank 1's must never appear
    x, y = global_data(size)
    model = make_model(seed=0)
    model.compile(optimizer=hk.DistributedOptimizer(keras.optimizers.SGD(LR, momentum=0.9)), loss="mse")
    ckpt = hk.CheckpointCallback(ckpt_dir, model, keep=2)
    first = ckpt.restore()  # None: nothing saved yet
    first_initial_epoch = ckpt.initial_epoch
    lrs = []
    record = keras.callbacks.LambdaCallback(
        on_train_batch_begin=lambda b, logs: lrs.append(float(model.optimizer.learning_rate))
    )
    warm = hk.LearningRateWarmupCallback(initial_lr=LR, warmup_epochs=2)
    model.fit(
        rank_rows(x, rank),
        rank_rows(y, rank),
        batch_size=B,
        epochs=3,
        shuffle=False,
        verbose=0,
        callbacks=[hk.BroadcastInitialStateCallback(), warm, record, ckpt],
    )
    saved = {
        "digest": digest(model),
        "opt": [np.asarray(v).tolist() for v in model.optimizer.variables],
        "iterations": int(model.optimizer.iterations),
    }
    model2 = make_model(seed=50 + rank)
    model2.compile(optimizer=hk.DistributedOptimizer(keras.optimizers.SGD(LR, momentum=0.9)), loss="mse")
    ckpt2 = hk.CheckpointCallback(ckpt_dir, model2)
    resumed = ckpt2.restore()
    restored = {
        "digest": digest(model2),
        "opt": [np.asarray(v).tolist() for v in model2.optimizer.variables],
        "iterations": int(model2.optimizer.iterations),
    }
    other = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    other.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    wrong_model_error = error_of(lambda: hk.CheckpointCallback(ckpt_dir, other).restore(), CheckpointError)
    listing = sorted(os.listdir(ckpt_dir)) if os.path.exists(ckpt_dir) else None
    return {
        "first_restore": first,
        "first_initial_epoch": first_initial_epoch,
        "resumed_epoch": resumed.epoch,
        "initial_epoch": ckpt2.initial_epoch,
        "saved": saved,
        "restored": restored,
        "lrs": lrs,
        "listing": listing,
        "wrong_model_error": wrong_model_error,
    }


def section_bad_input(rank):
    out = {
        "not_optimizer": error_of(lambda: hk.DistributedOptimizer("adam"), ConfigError),
        "compression": error_of(
            lambda: hk.DistributedOptimizer(keras.optimizers.SGD(0.1), compression="int8"), ConfigError
        ),
        "tape_compression": error_of(
            lambda: htf.DistributedGradientTape(tf.GradientTape(), compression="bf16"), ConfigError
        ),
    }
    # a variable list that differs across ranks: rank 1 has one variable more
    variables = [tf.Variable(np.zeros((2, 2), "float32"))] + (
        [tf.Variable(np.zeros(3, "float32"))] if rank == 1 else []
    )
    out["variables"] = error_of(lambda: hk.broadcast_variables(variables), CollectiveError)
    return out


def section_save_load(out_dir, rank):
    model = make_model(0)
    model.compile(optimizer=hk.DistributedOptimizer(keras.optimizers.Adam(0.01)), loss="mse")
    model.fit(np.ones((4, 8), "float32"), np.ones((4, 4), "float32"), verbose=0)
    path = os.path.join(out_dir, f"model-{rank}.keras")
    model.save(path)
    loaded = keras.models.load_model(path)
    return {
        "same_weights": bool(np.array_equal(weights_of(model), weights_of(loaded))),
        "optimizer_class": type(loaded.optimizer).__name__,
        "learning_rate": float(loaded.optimizer.learning_rate),
    }


def mixed_model():
    keras.mixed_precision.set_global_policy("mixed_float16")  # the caller sets float32 back
    return make_model(seed=0)


def section_mixed_precision(rank, size):
    # model.fit under mixed_float16: Keras's dynamic loss scaling around hk.DistributedOptimizer (sharded
    # or not). At step OVERFLOW one target of rank 1's batch is huge: its fp16 gradients overflow, rank
    # 0's do not. Every rank must skip that step and halve its loss scale, as one process does with the
    # whole global batch; a rank-local finite check let rank 0 enter the gradient average alone.
    g = np.random.RandomState(99)
    x = (0.5 * g.randn(STEPS, size * B, 8)).astype("float32")
    y = (0.1 * g.randn(STEPS, size * B, 4)).astype("float32")
    y[MIXED_OVERFLOW_STEP, size * B - 1, 0] = 3e4  # the last row of the global batch: rank 1's
    out = {}
    try:
        ref = mixed_model()
        ref.compile(optimizer=keras.optimizers.SGD(LR, momentum=0.9), loss="mse")
        ref.fit(x.reshape(-1, 8), y.reshape(-1, 4), batch_size=size * B, shuffle=False, verbose=0)
        out["reference"] = {"loss_scale": float(ref.optimizer.dynamic_scale.numpy())}
        out["reference"]["iterations"] = int(ref.optimizer.iterations.numpy())
        for name, shard in (("plain", False), ("sharded", True)):
            model = mixed_model()
            opt = hk.DistributedOptimizer(keras.optimizers.SGD(LR, momentum=0.9), shard_optimizer_state=shard)
            model.compile(optimizer=opt, loss="mse")
            model.fit(
                rank_rows(x, rank),
                rank_rows(y, rank),
                batch_size=B,
                shuffle=False,
                verbose=0,
                callbacks=[hk.BroadcastInitialStateCallback()],
            )
            kept = model.optimizer is opt
            if shard:  # the unsharded loss-scale optimizer's variables, gathered: what a checkpoint holds
                state = model.optimizer.consolidated_variables(to=None)
                specs = [list(shape) for shape, _ in model.optimizer.unsharded_specs()]
            else:
                state = [v.numpy() for v in model.optimizer.variables]
                plain_state, specs = state, [list(v.shape) for v in model.optimizer.variables]
            out[name] = {
                "state_specs": specs,
                "state_diff_vs_plain": max(float(np.max(np.abs(a - b), initial=0)) for a, b in zip(state, plain_state)),
                "kept": kept,
                "optimizer_class": type(model.optimizer).__name__,
                "loss_scale": float(model.optimizer.dynamic_scale.numpy()),
                "iterations": int(model.optimizer.iterations.numpy()),
                "digest": digest(model),
                "finite": bool(np.all(np.isfinite(weights_of(model)))),
                "max_diff_vs_reference": max_diff(model, ref),
            }
    finally:
        keras.mixed_precision.set_global_policy("float32")
    return out


def main(out_dir):
    topo = hk.init()
    rank, size = topo.rank, topo.size
    write_sections(
        out_dir,
        topo,
        fit=section_fit(rank, size),
        accumulation=section_accumulation(rank, size),
        custom_loop=section_custom_loop(rank, size),
        metrics=section_metrics(rank, size),
        checkpoint=section_checkpoint_and_warmup(rank, size, out_dir),
        bad_input=section_bad_input(rank),
        save_load=section_save_load(out_dir, rank),
        mixed_precision=section_mixed_precision(rank, size),
    )


if __name__ == "__main__":
    main(sys.argv[1])
