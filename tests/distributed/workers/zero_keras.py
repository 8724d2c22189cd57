"""Runs on every rank of a real Keras 3 job: ``shard_optimizer_state=True`` (ZeRO-1) against the unsharded optimizer.

``train`` (2 ranks): for each kind (SGD+momentum, Adam, AdamW with weight decay, SGD with
global_clipnorm, Adam with fp16 on the wire, SGD+momentum accumulating 2 batches a step) the same model is trained sharded and unsharded on the
same batches, under ``model.fit`` (``FIT``) or in an eager custom loop; every other allowed optimizer
eagerly. Each rank records its weights' digest, the largest relative difference to the unsharded
run, and the elements its optimizer's slot variables hold; the consolidated state of the sharded
AdamW is compared with the unsharded one's variables. A sharded AdamW run in a ``tf.function``
custom loop saves a checkpoint at step ``SAVE`` (directory ``a``) and goes on to ``STEPS``; a fresh
sharded AdamW restores it and trains to ``STEPS`` again (2 -> 2 ranks). ``resume`` (1 rank): an
unsharded AdamW restores ``a``, trains on the whole global batch to ``REGROW``, saves (directory
``b``) and goes on to ``STEPS``; a sharded one at 1 rank restores ``a`` too. ``regrow`` (2 ranks,
run under the other launcher): a sharded AdamW restores ``b`` and trains to ``STEPS``, then the
``QUICK`` kinds are trained as in ``train``. Writes OUT/<mode>-rank<r>.json.
Usage: python zero_keras.py OUT {train,resume,regrow}
"""

import hashlib
import json
import os
import sys
import time

import keras
import numpy as np
import tensorflow as tf

import hvdkit.keras as hk
import hvdkit.tensorflow as htf

STEPS = 16
SAVE = 8
REGROW = 12
GLOBAL = 8  # global batch
FIT_KINDS = {
    "sgd": lambda: keras.optimizers.SGD(0.05, momentum=0.9),
    "adam": lambda: keras.optimizers.Adam(0.01),
    "adamw": lambda: keras.optimizers.AdamW(0.01, weight_decay=0.1),
    "sgd_clip": lambda: keras.optimizers.SGD(0.05, momentum=0.9, global_clipnorm=0.05),
    "adam_fp16": lambda: keras.optimizers.Adam(0.01),
    "sgd_accum": lambda: keras.optimizers.SGD(0.05, momentum=0.9),  # backward_passes_per_step=2
}
FIT = ("sgd", "adamw", "sgd_clip", "sgd_accum")  # under model.fit; the other kinds in an eager custom loop
QUICK = ("sgd_clip", "adam_fp16")  # what regrow trains as well (run under another launcher than train)
OTHERS = {
    "Adamax": lambda: keras.optimizers.Adamax(0.01),
    "Nadam": lambda: keras.optimizers.Nadam(0.01),
    "RMSprop": lambda: keras.optimizers.RMSprop(0.01, momentum=0.5, centered=True),
    "Adagrad": lambda: keras.optimizers.Adagrad(0.05),
    "Adadelta": lambda: keras.optimizers.Adadelta(1.0),
    "Lion": lambda: keras.optimizers.Lion(0.001),
    "Ftrl": lambda: keras.optimizers.Ftrl(0.05, l1_regularization_strength=0.001, l2_regularization_strength=0.01),
}


def make_model():
    """55 trainable elements (28 on rank 0, 27 on rank 1) around a frozen Dense(4)."""
    keras.utils.set_random_seed(0)
    return keras.Sequential(
        [
            keras.Input((7,)),
            keras.layers.Dense(5, activation="tanh"),
            keras.layers.Dense(4, trainable=False),
            keras.layers.Dense(3),
        ]
    )


def data():
    x = np.linspace(-1, 1, STEPS * GLOBAL * 7, dtype="float32").reshape(STEPS * GLOBAL, 7)
    return x, np.sin(3 * x[:, :3]).astype("float32")


def local_batch(step, rank, size):
    """The rows of the global batch ``step`` that ``rank`` of ``size`` trains on."""
    x, y = data()
    per = GLOBAL // size
    rows = slice(step * GLOBAL + rank * per, step * GLOBAL + (rank + 1) * per)
    return x[rows], y[rows]


def digest(variables):
    h = hashlib.sha256()
    for v in variables:
        h.update(np.ascontiguousarray(np.asarray(v)).tobytes())
    return h.hexdigest()


def rel_diff(a, b):
    return max(float(np.max(np.abs(x - y)) / (np.max(np.abs(y)) + 1e-12)) for x, y in zip(a, b, strict=True))


def slot_elements(opt):
    """Elements of the optimizer's per-element state: every variable that is not a scalar."""
    return sum(int(np.prod(v.shape)) for v in opt.variables if len(v.shape) > 0)


def fit(kind, make, shard, rank, size, out=None):
    model = make_model()
    compression = "fp16" if kind.endswith("fp16") else "none"
    passes = 2 if kind.endswith("accum") else 1
    opt = hk.DistributedOptimizer(
        make(), compression=compression, backward_passes_per_step=passes, shard_optimizer_state=shard
    )
    model.compile(optimizer=opt, loss="mse")
    x, y = data()
    per = GLOBAL // size
    rows = np.concatenate([np.arange(s * GLOBAL + rank * per, s * GLOBAL + (rank + 1) * per) for s in range(STEPS)])
    model.fit(
        x[rows],
        y[rows],
        batch_size=per,
        epochs=1,
        shuffle=False,
        verbose=0,
        callbacks=[hk.BroadcastInitialStateCallback()]
        + ([hk.CheckpointCallback(os.path.join(out, "fit"), model)] if shard and kind == "adamw" else []),
    )
    return model, opt


def eager_loop(kind, make, shard, rank, size, steps=3):
    model = make_model()
    compression = "fp16" if kind.endswith("fp16") else "none"
    opt = hk.DistributedOptimizer(make(), compression=compression, shard_optimizer_state=shard)
    for step in range(steps):
        x, y = local_batch(step, rank, size)
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(model(x, training=True) - y))
        opt.apply(tape.gradient(loss, model.trainable_variables), model.trainable_variables)
    return model, opt


def compare(kind, sharded, plain):
    (model, opt), (pmodel, popt) = sharded, plain
    weights = [w.numpy() for w in model.trainable_weights]
    start = [w.numpy() for w in make_model().trainable_weights]
    frozen = model.layers[1]
    return {
        "digest": digest(weights),
        "rel_diff": rel_diff(weights, [w.numpy() for w in pmodel.trainable_weights]),
        "moved": max(float(np.max(np.abs(w - s))) for w, s in zip(weights, start, strict=True)),
        "frozen_kept": digest(frozen.weights) == digest(make_model().layers[1].weights),
        "frozen_digest": digest(frozen.weights),
        "slot_elements": slot_elements(opt),
        "plain_slot_elements": slot_elements(popt),
        "iterations": int(opt.iterations.numpy()),
    }


def train_step(model, opt):
    """One step of a custom loop, in a ``tf.function``."""

    @tf.function
    def step(x, y):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(model(x, training=True) - y))
        opt.apply(tape.gradient(loss, model.trainable_variables), model.trainable_variables)

    return step


def loop(step, start, stop, rank, size):
    """Train steps ``[start, stop)`` of the data."""
    for s in range(start, stop):
        step(*local_batch(s, rank, size))


def adamw(shard):
    model = make_model()
    opt = hk.DistributedOptimizer(keras.optimizers.AdamW(0.01, weight_decay=0.1), shard_optimizer_state=shard)
    opt.build(model.trainable_variables)
    return model, opt


def timed(result, name, call):
    start = time.perf_counter()
    result[name] = call()
    result.setdefault("seconds", {})[name] = round(time.perf_counter() - start, 2)


def kinds(result, rank, size, names, out=None):
    """Train each kind of ``names`` sharded and unsharded (``FIT`` under model.fit, the rest eagerly); compare."""
    runs = {}
    for kind in names:
        make, loop = FIT_KINDS[kind], fit if kind in FIT else eager_loop

        def both(kind=kind, make=make, loop=loop):
            sharded = loop(kind, make, True, rank, size, out) if loop is fit else loop(kind, make, True, rank, size)
            runs[kind] = sharded, loop(kind, make, False, rank, size)
            return compare(kind, *runs[kind])

        timed(result, kind, both)
    return runs


def train(out, rank, size):
    result = {}
    runs = kinds(result, rank, size, FIT_KINDS, out)
    # clipping by a norm of this rank's slices alone would end elsewhere: the clipping really acted
    clipped, unclipped = runs["sgd_clip"][0][0], runs["sgd"][1][0]
    result["sgd_clip"]["vs_unclipped"] = max(
        float(np.max(np.abs(a.numpy() - b.numpy())))
        for a, b in zip(clipped.trainable_weights, unclipped.trainable_weights, strict=True)
    )
    for kind, make in OTHERS.items():
        timed(
            result,
            kind,
            lambda kind=kind, make=make: compare(
                kind, eager_loop(kind, make, True, rank, size), eager_loop(kind, make, False, rank, size)
            ),
        )
    # the consolidated state of the sharded AdamW that fit trained is the unsharded one's variables
    (_, opt), (_, plain_opt) = runs["adamw"]
    consolidated = opt.consolidated_variables(to=None)
    result["consolidated_shapes_match"] = [list(a.shape) for a in consolidated] == [
        list(v.shape) for v in plain_opt.variables
    ]
    result["consolidated_rel_diff"] = rel_diff(consolidated[2:], [v.numpy() for v in plain_opt.variables[2:]])
    result["consolidated_iterations"] = int(consolidated[0])
    result["plain_adamw_state"] = [v.numpy().tolist() for v in plain_opt.variables]

    # checkpoints: the uninterrupted sharded run saves at SAVE
    start = time.perf_counter()
    model, opt = adamw(True)
    step = train_step(model, opt)
    loop(step, 0, SAVE, rank, size)
    htf.Checkpointer(os.path.join(out, "a"), model, opt).save(step=SAVE, epoch=1)
    loop(step, SAVE, STEPS, rank, size)
    result["uninterrupted"] = [w.numpy().tolist() for w in model.trainable_weights]
    result["uninterrupted_digest"] = digest([w.numpy() for w in model.trainable_weights])
    fresh, fresh_opt = adamw(True)
    resumed = htf.Checkpointer(os.path.join(out, "a"), fresh, fresh_opt).restore()
    result["resumed_step"] = resumed.step
    result["resumed_iterations"] = int(fresh_opt.iterations.numpy())
    loop(train_step(fresh, fresh_opt), SAVE, STEPS, rank, size)
    result["resumed_digest"] = digest([w.numpy() for w in fresh.trainable_weights])
    result["seconds"]["checkpoints"] = round(time.perf_counter() - start, 2)
    return result


def resume(out, rank, size):
    result = {}
    model, opt = adamw(False)
    htf.Checkpointer(os.path.join(out, "a"), model, opt).restore()
    result["iterations"] = int(opt.iterations.numpy())
    step = train_step(model, opt)
    loop(step, SAVE, REGROW, rank, size)
    htf.Checkpointer(os.path.join(out, "b"), model, opt).save(step=REGROW, epoch=2)
    loop(step, REGROW, STEPS, rank, size)
    result["unsharded"] = [w.numpy().tolist() for w in model.trainable_weights]
    model, opt = adamw(True)  # sharded at 1 rank: the whole slice
    htf.Checkpointer(os.path.join(out, "a"), model, opt).restore()
    loop(train_step(model, opt), SAVE, STEPS, rank, size)
    result["sharded"] = [w.numpy().tolist() for w in model.trainable_weights]
    # what CheckpointCallback saved at the end of the sharded fit: an unsharded optimizer's state
    model = make_model()
    model.compile(optimizer=hk.DistributedOptimizer(FIT_KINDS["adamw"]()), loss="mse")
    ckpt = hk.CheckpointCallback(os.path.join(out, "fit"), model)
    result["fit_epoch"] = ckpt.restore().epoch
    result["fit_state"] = [v.numpy().tolist() for v in model.optimizer.variables]
    return result


def regrow(out, rank, size):
    model, opt = adamw(True)
    resumed = htf.Checkpointer(os.path.join(out, "b"), model, opt).restore()
    iterations = int(opt.iterations.numpy())
    loop(train_step(model, opt), REGROW, STEPS, rank, size)
    weights = [w.numpy() for w in model.trainable_weights]
    result = {
        "step": resumed.step,
        "world_size": resumed.world_size,
        "iterations": iterations,
        "weights": [w.tolist() for w in weights],
        "digest": digest(weights),
        "slot_elements": slot_elements(opt),
    }
    kinds(result, rank, size, QUICK)  # the same kinds' checks under this launcher too
    return result


def main(out, mode):
    started = time.perf_counter()
    topo = hk.init()
    result = {"train": train, "resume": resume, "regrow": regrow}[mode](out, topo.rank, topo.size)
    result["worker_seconds"] = round(time.perf_counter() - started, 2)
    with open(os.path.join(out, f"{mode}-rank{topo.rank}.json"), "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
