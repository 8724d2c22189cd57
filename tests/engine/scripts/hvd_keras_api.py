"""Horovod's Keras API used as Horovod users write it, on every rank of a real job.

Both flavours run in the one job: ``horovod.tensorflow.keras`` (``hvd``) for every surface and the
standalone ``horovod.keras`` (``hvd_k``) for the optimizer, callbacks and ``load_model``. Each
section trains on rank-dependent rows of deterministic global batches and records the weights'
SHA-256 and their distance to one process trained on the whole batches, computed here without any
collective. Writes OUT/rank<r>.json. Usage: python hvd_keras_api.py OUT
"""

import hashlib
import json
import os
import sys

import numpy as np
import keras
import tensorflow as tf

import horovod.keras as hvd_k
import horovod.tensorflow.keras as hvd

STEPS = 4  # global batches per epoch
B = 4  # per-rank batch
LR = 0.1


def make_model(seed):
    keras.utils.set_random_seed(seed)
    return keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="tanh"), keras.layers.Dense(4)])


def clone(model):
    twin = make_model(0)
    twin.set_weights(model.get_weights())
    return twin


def flat(model_or_weights):
    weights = model_or_weights.get_weights() if hasattr(model_or_weights, "get_weights") else model_or_weights
    return np.concatenate([np.ravel(w).astype(np.float64) for w in weights])


def digest(model):
    return hashlib.sha256(flat(model).tobytes()).hexdigest()


def diff(a, b):
    return float(np.max(np.abs(flat(a) - flat(b))))


def global_data(steps=STEPS, seed=1234):
    g = np.random.RandomState(seed)
    size = hvd.size()
    return g.randn(steps, size * B, 8).astype("float32"), g.randn(steps, size * B, 4).astype("float32")


def rows(a, rank=None):
    """This rank's part of every global batch, in step order."""
    r = hvd.rank() if rank is None else rank
    return np.concatenate([step[r * B:(r + 1) * B] for step in a])


def record(model, ref, **extra):
    return {"digest": digest(model), "max_diff_vs_reference": diff(model, ref), **extra}


_sgd_refs = {}


def reference_sgd_momentum(init, x, y):
    """reference_fit with SGD(LR, momentum=0.9), computed once per inputs (several sections compare to it)."""
    key = (digest(init), x.tobytes(), y.tobytes())
    if key not in _sgd_refs:
        _sgd_refs[key] = reference_fit(init, x, y, keras.optimizers.SGD(LR, momentum=0.9))
    return _sgd_refs[key]


def reference_fit(init, x, y, optimizer, epochs=1, lrs=None):
    """One process, plain Keras, the whole global batch per step (optionally a learning rate per step)."""
    model = clone(init)
    model.compile(optimizer=optimizer, loss="mse")
    steps = x.shape[0]
    callbacks = []
    if lrs is not None:
        def set_lr(epoch_batch):
            model.optimizer.learning_rate = lrs[epoch_batch]
        callbacks = [LrSetter(set_lr, steps)]
    model.fit(x.reshape(-1, x.shape[-1]), y.reshape(-1, y.shape[-1]), batch_size=x.shape[1], epochs=epochs,
              shuffle=False, verbose=0, callbacks=callbacks)
    return model


class LrSetter(keras.callbacks.Callback):
    def __init__(self, set_lr, steps):
        super().__init__()
        self.set_lr, self.steps, self.epoch = set_lr, steps, 0

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_train_batch_begin(self, batch, logs=None):
        self.set_lr(self.epoch * self.steps + batch)


class LrRecorder(keras.callbacks.Callback):
    """Records the learning rate each batch trains with (placed after Horovod's LR callbacks)."""

    def __init__(self):
        super().__init__()
        self.lrs = []

    def on_train_batch_begin(self, batch, logs=None):
        self.lrs.append(float(self.model.optimizer.learning_rate.numpy()))


class LogCopy(keras.callbacks.Callback):
    """A copy of the epoch logs as this callback sees them (before or after MetricAverageCallback)."""

    def __init__(self):
        super().__init__()
        self.logs = []

    def on_epoch_end(self, epoch, logs=None):
        self.logs.append(dict((k, float(v)) for k, v in (logs or {}).items()))


def fit(opt, init, x, y, epochs=1, callbacks=()):
    model = clone(init)
    model.compile(optimizer=opt, loss="mse")
    history = model.fit(rows(x), rows(y), batch_size=B, epochs=epochs, shuffle=False, verbose=0,
                        callbacks=list(callbacks))
    return model, history


def section_fit(mod, out_dir, every_way=True):
    """fit with DistributedOptimizer built four ways, and BroadcastGlobalVariablesCallback from different inits."""
    x, y = global_data()
    init0 = make_model(seed=0)
    out = {"init_digest": digest(make_model(seed=hvd.rank()))}
    model, _ = fit(mod.DistributedOptimizer(keras.optimizers.SGD(LR, momentum=0.9)), make_model(seed=hvd.rank()),
                   x, y, callbacks=[mod.callbacks.BroadcastGlobalVariablesCallback(0)])
    ref = reference_sgd_momentum(init0, x, y)
    out["instance"] = record(model, ref, moved=diff(ref, init0))
    made = {
        "from_name": (keras.optimizers.get("adam"), keras.optimizers.Adam()),
        "from_config": (keras.optimizers.deserialize({"class_name": "Adam", "config": {"learning_rate": 0.01}}),
                        keras.optimizers.Adam(0.01)),
        "name_string": ("sgd", keras.optimizers.SGD()),
    }
    for label, (given, plain) in made.items() if every_way else ():
        model_k, _ = fit(mod.DistributedOptimizer(given), init0, x, y)
        out[label] = record(model_k, reference_fit(init0, x, y, plain))
    # The model just trained saves (the optimizer config is the plain SGD's) and reloads re-wrapped.
    path = os.path.join(out_dir, "fit-%s.keras" % mod.__name__)
    if hvd.rank() == 0:
        model.save(path)
    out["barrier"] = float(np.asarray(mod.allreduce(1.0, name="saved")))
    loaded = mod.load_model(path)
    x2, y2 = global_data(seed=99)
    loaded.fit(rows(x2), rows(y2), batch_size=B, shuffle=False, verbose=0)
    plain = keras.models.load_model(path)
    plain.fit(x2.reshape(-1, 8), y2.reshape(-1, 4), batch_size=x2.shape[1], shuffle=False, verbose=0)
    out["load_model"] = record(loaded, plain, optimizer_class=type(loaded.optimizer).__name__,
                               iterations=int(loaded.optimizer.iterations.numpy()))
    return out


def section_custom_loop():
    """A GradientTape loop calling apply_gradients (eager) and apply (tf.function) on the wrapped optimizer."""
    x, y = global_data()
    init = make_model(seed=0)
    ref = reference_sgd_momentum(init, x, y)
    out = {}
    for label, compiled in (("apply_gradients_eager", False), ("apply_function", True)):
        model = clone(init)
        opt = hvd.DistributedOptimizer(keras.optimizers.SGD(LR, momentum=0.9))

        def step(xb, yb, model=model, opt=opt, compiled=compiled):
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean(tf.square(model(xb) - yb))
            grads = tape.gradient(loss, model.trainable_variables)
            if compiled:
                opt.apply(grads, model.trainable_variables)
            else:
                opt.apply_gradients(zip(grads, model.trainable_variables))

        step = tf.function(step) if compiled else step
        r = hvd.rank()
        for s in range(STEPS):
            step(x[s, r * B:(r + 1) * B], y[s, r * B:(r + 1) * B])
        out[label] = record(model, ref)
    return out


def section_options(mod, every_option=True):
    """backward_passes_per_step (mean and sum), gradient_predivide_factor and fp16 compression."""
    x, y = global_data(steps=2 * STEPS)
    size = hvd.size()
    init = make_model(seed=0)
    # Update s averages micro-batches 2s and 2s+1 of every rank: one process with batch 2 * size * B.
    xw, yw = x.reshape(STEPS, 2 * size * B, 8), y.reshape(STEPS, 2 * size * B, 4)
    out = {}
    opt = mod.DistributedOptimizer(keras.optimizers.SGD(LR, momentum=0.9), backward_passes_per_step=2,
                                   average_aggregated_gradients=True)
    model, _ = fit(opt, init, x, y)
    out["bpps_mean"] = record(model, reference_fit(init, xw, yw, keras.optimizers.SGD(LR, momentum=0.9)),
                              iterations=int(opt.iterations.numpy()))
    if not every_option:
        return out
    # Without averaging the two passes add up: as one process with twice the learning rate.
    opt = mod.DistributedOptimizer(keras.optimizers.SGD(LR, momentum=0.9), backward_passes_per_step=2)
    model, _ = fit(opt, init, x, y)
    out["bpps_sum"] = record(model, reference_fit(init, xw, yw, keras.optimizers.SGD(2 * LR, momentum=0.9)),
                             iterations=int(opt.iterations.numpy()))
    x, y = global_data()
    ref = reference_sgd_momentum(init, x, y)
    for label, kwargs in {"predivide": {"gradient_predivide_factor": 2.0},
                          "fp16": {"compression": mod.Compression.fp16}}.items():
        model, _ = fit(mod.DistributedOptimizer(keras.optimizers.SGD(LR, momentum=0.9), **kwargs), init, x, y)
        out[label] = record(model, ref)
    # What a wrong reduction would give: this rank's rows only.
    out["wrong_local_only_diff"] = diff(reference_fit(init, x[:, :B], y[:, :B], keras.optimizers.SGD(LR, momentum=0.9)),
                                        ref)
    return out


def make_embedding_model(seed=0):
    keras.utils.set_random_seed(seed)
    return keras.Sequential([keras.Input((3,), dtype="int32"), keras.layers.Embedding(10, 4), keras.layers.Flatten(),
                             keras.layers.Dense(1)])


def section_sparse():
    """An Embedding's gradient is IndexedSlices: allgathered as is, or densified with sparse_as_dense."""
    g = np.random.RandomState(7)
    size, r = hvd.size(), hvd.rank()
    x = g.randint(0, 10, size=(STEPS, size * B, 3)).astype("int32")
    y = g.randn(STEPS, size * B, 1).astype("float32")
    init = make_embedding_model()
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(init(x[0]))
    grad_type = type(tape.gradient(loss, init.trainable_variables)[0]).__name__
    ref = make_embedding_model()
    ref.compile(optimizer=keras.optimizers.SGD(LR), loss="mse")
    ref.fit(x.reshape(-1, 3), y.reshape(-1, 1), batch_size=size * B, shuffle=False, verbose=0)
    out = {"embedding_grad_type": grad_type}
    for label, dense in (("sparse", False), ("sparse_as_dense", True)):
        model = make_embedding_model()
        model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(LR), sparse_as_dense=dense), loss="mse")
        model.fit(np.concatenate([s[r * B:(r + 1) * B] for s in x]), np.concatenate([s[r * B:(r + 1) * B] for s in y]),
                  batch_size=B, shuffle=False, verbose=0)
        out[label] = record(model, ref)
    return out


def head_offset(rank):
    return 0.05 * (rank + 1)


def section_partial(mod):
    """PartialDistributedOptimizer: the head layer stays local (its gradient / size), the rest is averaged;
    BroadcastGlobalVariablesCallback(local_variables=...) leaves the heads alone."""
    x, y = global_data()
    size, r = hvd.size(), hvd.rank()
    base = make_model(seed=0)
    model = clone(base)
    head = model.layers[1]
    head.set_weights([w + head_offset(r) for w in head.get_weights()])
    opt = mod.PartialDistributedOptimizer(keras.optimizers.SGD(LR), local_layers=[head])
    model.compile(optimizer=opt, loss="mse")
    model.fit(rows(x), rows(y), batch_size=B, shuffle=False, verbose=0,
              callbacks=[mod.callbacks.BroadcastGlobalVariablesCallback(0, local_variables=head.trainable_weights)])
    shared, heads = reference_partial(base, x, y, size)
    return {
        "shared_digest": hashlib.sha256(flat(model.layers[0].get_weights()).tobytes()).hexdigest(),
        "head_digest": hashlib.sha256(flat(head.get_weights()).tobytes()).hexdigest(),
        "shared_diff": float(np.max(np.abs(flat(model.layers[0].get_weights()) - flat(shared)))),
        "head_diff": float(np.max(np.abs(flat(head.get_weights()) - flat(heads[r])))),
    }


def reference_partial(base, x, y, size):
    """One process: shared layer plus one head per rank, loss = mean over ranks of each rank's mse."""
    w, b = [tf.Variable(v) for v in base.layers[0].get_weights()]
    heads = [[tf.Variable(v + head_offset(r)) for v in base.layers[1].get_weights()] for r in range(size)]
    for s in range(STEPS):
        with tf.GradientTape() as tape:
            losses = []
            for r in range(size):
                h = tf.tanh(tf.matmul(x[s, r * B:(r + 1) * B], w) + b)
                pred = tf.matmul(h, heads[r][0]) + heads[r][1]
                losses.append(tf.reduce_mean(tf.square(pred - y[s, r * B:(r + 1) * B])))
            loss = tf.add_n(losses) / size
        variables = [w, b] + [v for hv in heads for v in hv]
        for v, g in zip(variables, tape.gradient(loss, variables)):
            v.assign_sub(LR * g)
    return [w.numpy(), b.numpy()], [[v.numpy() for v in hv] for hv in heads]


def warmup_lrs(initial_lr, warmup_epochs, epochs, size):
    """Horovod's documented warmup: lr = initial_lr / size * (epoch * (size - 1) / warmup + 1),
    epoch counted in fractions of an epoch at each batch's end; kept after the warmup."""
    lrs = []
    for e in range(epochs):
        for b in range(STEPS):
            if e < warmup_epochs:
                t = e + (b + 1) / STEPS
                lrs.append(initial_lr / size * (t * (size - 1) / warmup_epochs + 1))
            else:
                lrs.append(lrs[-1])
    return lrs


def section_callbacks(mod, every_callback=True):
    """MetricAverageCallback, LearningRateWarmupCallback and LearningRateScheduleCallback in fit."""
    x, y = global_data()
    size = hvd.size()
    init = make_model(seed=0)
    before, after, lrs = LogCopy(), LogCopy(), LrRecorder()
    callbacks = [mod.callbacks.BroadcastGlobalVariablesCallback(0), before, mod.callbacks.MetricAverageCallback(),
                 mod.callbacks.LearningRateWarmupCallback(initial_lr=LR * size, warmup_epochs=2), lrs, after]
    model, history = fit(mod.DistributedOptimizer(keras.optimizers.SGD(LR * size)), init, x, y, epochs=3,
                         callbacks=callbacks)
    expect = warmup_lrs(LR * size, 2, 3, size)
    ref = reference_fit(init, x, y, keras.optimizers.SGD(LR * size), epochs=3, lrs=expect)
    out = {"warmup": record(model, ref, lrs=lrs.lrs, expected_lrs=expect),
           "metric_average": {"local": before.logs, "averaged": after.logs,
                              "history_loss": [float(v) for v in history.history["loss"]]}}
    if not every_callback:
        return out
    sched = LrRecorder()
    halve = mod.callbacks.LearningRateScheduleCallback(initial_lr=LR, multiplier=lambda epoch: 0.5 ** epoch)
    callbacks = [halve, sched]
    model, history = fit(mod.DistributedOptimizer(keras.optimizers.SGD(LR)), init, x, y, epochs=3, callbacks=callbacks)
    expect = [LR * 0.5 ** e for e in range(3) for _ in range(STEPS)]
    ref = reference_fit(init, x, y, keras.optimizers.SGD(LR), epochs=3, lrs=expect)
    out["schedule"] = record(model, ref, lrs=sched.lrs, expected_lrs=expect,
                             logged_lr=[float(v) for v in history.history["lr"]])
    return out


def error_of(call):
    try:
        call()
    except Exception as e:  # noqa: BLE001 - the message is what is recorded
        return "%s: %s" % (type(e).__name__, e)
    return None


def section_keras2_apis(mod, out_dir):
    """What Keras 3 removed gives an error naming the replacement (and no collective is left waiting)."""
    return {
        "lr_config": error_of(lambda: mod.DistributedOptimizer({"class_name": "SGD", "config": {"lr": 0.1}})),
        "v1_optimizer": error_of(lambda: mod.DistributedOptimizer(tf.compat.v1.train.GradientDescentOptimizer(0.1))),
        "legacy_opts": error_of(lambda: mod.load_model(os.path.join(out_dir, "fit-%s.keras" % mod.__name__),
                                                         legacy_opts=True)),
        "rewrap": error_of(lambda: mod.DistributedOptimizer(mod.DistributedOptimizer(keras.optimizers.SGD(0.1)))),
        "after": float(np.asarray(mod.allreduce(float(hvd.rank() + 1), name="after_errors"))),
    }


def section_collectives(mod):
    return {
        "allreduce": float(np.asarray(mod.allreduce(float(hvd.rank() + 1), name="c.allreduce"))),
        "allgather": np.asarray(mod.allgather([hvd.rank() + 1], name="c.allgather")).tolist(),
        "broadcast": float(np.asarray(mod.broadcast(float(hvd.rank() + 5), 0, name="c.broadcast"))),
    }


def main(out_dir, only=()):
    """Every section, or with ``only`` (names of sections) those alone, for both flavours (the fit section
    then without its optimizer-construction variants)."""
    hvd.init()
    result = {"rank": hvd.rank(), "size": hvd.size()}
    every = not only
    tf_keras = {
        "fit": lambda: section_fit(hvd, out_dir, every_way=every),
        "custom_loop": section_custom_loop,
        "options": lambda: section_options(hvd),
        "sparse": section_sparse,
        "partial": lambda: section_partial(hvd),
        "callbacks": lambda: section_callbacks(hvd),
        "keras2_apis": lambda: section_keras2_apis(hvd, out_dir),
        "collectives": lambda: section_collectives(hvd),
    }
    # The standalone flavour shares the implementation: its own entry points, fewer variants.
    standalone = {
        "fit": lambda: section_fit(hvd_k, out_dir, every_way=False),
        "options": lambda: section_options(hvd_k, every_option=False),
        "partial": lambda: section_partial(hvd_k),
        "callbacks": lambda: section_callbacks(hvd_k, every_callback=False),
        "keras2_apis": lambda: section_keras2_apis(hvd_k, out_dir),
        "collectives": lambda: section_collectives(hvd_k),
    }
    unknown = set(only) - set(tf_keras)
    if unknown:
        raise SystemExit("unknown section(s) %s; the sections: %s" % (sorted(unknown), sorted(tf_keras)))
    for flavour, sections in (("tf_keras", tf_keras), ("keras", standalone)):
        result[flavour] = {name: run() for name, run in sections.items() if every or name in only}
    with open(os.path.join(out_dir, "rank%d.json" % hvd.rank()), "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
