"""Horovod's own TensorFlow API, used the way Horovod users write it, on every rank of a 2-rank job.

Surfaces: ``hvd.DistributedGradientTape`` (dense Keras 3 model, plain ``tf.Variable``s, an Embedding's
``IndexedSlices`` with and without ``sparse_as_dense``, fp16 compression),
``hvd.PartialDistributedGradientTape`` with a local layer, ``register_local_source`` on a
``tf.Variable``, ``hvd.broadcast_variables`` (Keras 3 model and ``tf.Variable``s) and
``hvd.SyncBatchNormalization``; each in eager mode and inside ``tf.function``. Then
``hvd.broadcast_object`` / ``hvd.allgather_object`` with different object types on the ranks.

Every case records its error (if any), a SHA-256 of its parameters (equal on every rank when the
ranks agree) and its largest difference from a reference computed here without collectives: one
process trained on the concatenated batches (for local sources: every rank simulated in turn).
Writes OUT/rank<r>.json.  Usage: python hvd_tf_api.py OUT
"""

import hashlib
import json
import os
import sys
import traceback

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import horovod.tensorflow as hvd  # noqa: E402

STEPS = 2
B = 4  # per-rank batch
LR = 0.1


def closed_form(shape, k):
    """Deterministic values in [-0.5, 0.5] that differ with ``k``."""
    n = int(np.prod(shape))
    return (0.5 * np.sin(np.arange(n, dtype=np.float64) * 0.7 + k)).reshape(shape).astype(np.float32)


def set_weights(model, k=0.0):
    model.set_weights([closed_form(w.shape, i + k) for i, w in enumerate(model.get_weights())])


def params(variables):
    return np.concatenate([np.asarray(v.numpy(), np.float64).ravel() for v in variables])


def digest(variables):
    return hashlib.sha256(np.concatenate([np.asarray(v.numpy()).ravel() for v in variables]).tobytes()).hexdigest()


def batch(rank, step, features=4):
    x = np.cos(np.arange(B * features, dtype=np.float64) * (rank + 1) + step).reshape(B, features).astype(np.float32)
    y = np.sin(np.arange(B, dtype=np.float64) * (rank + 2) + step).reshape(B, 1).astype(np.float32)
    return x, y


def full_batch(size, step, features=4):
    parts = [batch(r, step, features) for r in range(size)]
    return np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])


def mse(pred, y):
    return tf.reduce_mean(tf.square(pred - y))


def dense_model():
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3, activation="tanh"), keras.layers.Dense(1)])
    set_weights(model)
    return model


def embedding_model():
    model = keras.Sequential(
        [keras.Input((3,), dtype="int32"), keras.layers.Embedding(10, 2), keras.layers.Flatten(), keras.layers.Dense(1)]
    )
    set_weights(model)
    return model


def token_batch(rank, step):
    ids = ((np.arange(B * 3) * (rank + 3) + step) % 7).reshape(B, 3).astype(np.int32)
    y = np.cos(np.arange(B, dtype=np.float64) + rank + step).reshape(B, 1).astype(np.float32)
    return ids, y


def maybe_function(fn, mode):
    return tf.function(fn) if mode == "function" else fn


# --- DistributedGradientTape on a Keras 3 model ------------------------------------------------------


def keras_tape_case(mode, make_model, get_batch, groups_of=None, **tape_kwargs):
    """Train with hvd.DistributedGradientTape and keras SGD; reference: one process on all batches.

    ``groups_of(model)``: the tape's ``groups`` (lists of variables allreduced together).
    """
    model, ref = make_model(), make_model()
    if groups_of is not None:
        tape_kwargs["groups"] = groups_of(model)
    opt, ref_opt = keras.optimizers.SGD(LR), keras.optimizers.SGD(LR)
    grad_types = []

    def train_step(x, y):
        with tf.GradientTape() as tape:
            loss = mse(model(x, training=True), y)
        tape = hvd.DistributedGradientTape(tape, **tape_kwargs)
        grads = tape.gradient(loss, model.trainable_variables)
        grad_types[:] = [type(g).__name__ for g in grads]
        opt.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    step = maybe_function(train_step, mode)
    for s in range(STEPS):
        x, y = get_batch(hvd.rank(), s)
        step(tf.constant(x), tf.constant(y))
        parts = [get_batch(r, s) for r in range(hvd.size())]
        fx, fy = np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])
        with tf.GradientTape() as tape:
            loss = mse(ref(fx, training=True), fy)
        ref_opt.apply_gradients(zip(tape.gradient(loss, ref.trainable_variables), ref.trainable_variables))
    return model.trainable_variables, ref.trainable_variables, {"grad_types": grad_types}


def distributed_optimizer_case(mode):
    """horovod.tensorflow.DistributedOptimizer around a Keras 3 optimizer, in a custom loop."""
    model, ref = dense_model(), dense_model()
    opt, ref_opt = hvd.DistributedOptimizer(keras.optimizers.SGD(LR)), keras.optimizers.SGD(LR)

    def train_step(x, y):
        with tf.GradientTape() as tape:
            loss = mse(model(x, training=True), y)
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables))

    step = maybe_function(train_step, mode)
    for s in range(STEPS):
        step(*map(tf.constant, batch(hvd.rank(), s)))
        fx, fy = full_batch(hvd.size(), s)
        with tf.GradientTape() as tape:
            loss = mse(ref(fx, training=True), fy)
        ref_opt.apply_gradients(zip(tape.gradient(loss, ref.trainable_variables), ref.trainable_variables))
    return model.trainable_variables, ref.trainable_variables, {}


# --- DistributedGradientTape on plain tf.Variables ---------------------------------------------------


def linear_vars():
    return tf.Variable(closed_form((4, 1), 1)), tf.Variable(closed_form((1,), 2))


def linear_loss(w, b, x, y):
    return mse(tf.matmul(x, w) + b, y)


def linear_train_step(w, b, local_source=None, **tape_kwargs):
    """One SGD step of the linear model through DistributedGradientTape (``local_source`` kept local)."""

    def train_step(x, y):
        with tf.GradientTape() as tape:
            loss = linear_loss(w, b, x, y)
        tape = hvd.DistributedGradientTape(tape, **tape_kwargs)
        if local_source is not None:
            tape.register_local_source(local_source)
        gw, gb = tape.gradient(loss, [w, b])
        w.assign_sub(LR * gw)
        b.assign_sub(LR * gb)

    return train_step


def tf_variable_case(mode, **tape_kwargs):
    w, b = linear_vars()
    rw, rb = linear_vars()
    step = maybe_function(linear_train_step(w, b, **tape_kwargs), mode)
    for s in range(STEPS):
        step(*map(tf.constant, batch(hvd.rank(), s)))
        fx, fy = full_batch(hvd.size(), s)
        with tf.GradientTape() as tape:
            loss = linear_loss(rw, rb, fx, fy)
        gw, gb = tape.gradient(loss, [rw, rb])
        rw.assign_sub(LR * gw)
        rb.assign_sub(LR * gb)
    return [w, b], [rw, rb], {}


def fp16_exact_batch(rank, step):
    """Inputs whose gradients (the mean of x) are exact in float16, so fp16 compression loses nothing."""
    x = (((np.arange(B * 4) + rank * 3 + step) % 5) * 0.25).reshape(B, 4).astype(np.float32)
    return x, np.zeros((B, 1), np.float32)


def fp16_case(mode):
    """Loss = mean(x @ w): its gradient is exact in fp16, so the compressed average equals the exact one."""
    w, rw = tf.Variable(np.zeros((4, 1), np.float32)), tf.Variable(np.zeros((4, 1), np.float32))

    def train_step(x):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.matmul(x, w))
        tape = hvd.DistributedGradientTape(tape, compression=hvd.Compression.fp16)
        (g,) = tape.gradient(loss, [w])
        w.assign_sub(0.5 * g)
        return g

    step = maybe_function(train_step, mode)
    for s in range(STEPS):
        dtype = step(tf.constant(fp16_exact_batch(hvd.rank(), s)[0])).dtype
        fx = np.concatenate([fp16_exact_batch(r, s)[0] for r in range(hvd.size())])
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.matmul(fx, rw))
        rw.assign_sub(0.5 * tape.gradient(loss, rw))
    return [w], [rw], {"grad_dtype": tf.as_dtype(dtype).name}


# --- local sources: PartialDistributedGradientTape and register_local_source -------------------------


def simulate_local(size, rank, init, local_idx, grads_of):
    """Every rank of a job whose variables ``local_idx`` are local, simulated in one process.

    ``grads_of(weights, r, step)`` is rank r's own gradient. Global gradients are averaged; a local
    gradient is the rank's own divided by size (Horovod's ``scale_local_gradients=True``).
    Returns rank ``rank``'s weights after STEPS steps of SGD.
    """
    weights = [[w.copy() for w in init] for _ in range(size)]
    for s in range(STEPS):
        grads = [grads_of(weights[r], r, s) for r in range(size)]
        for r in range(size):
            for i in range(len(init)):
                g = grads[r][i] / size if i in local_idx else sum(gr[i] for gr in grads) / size
                weights[r][i] = weights[r][i] - LR * g
    return weights[rank]


def partial_tape_case(mode):
    """PartialDistributedGradientTape with the output layer local (model parallel head)."""
    model = dense_model()
    opt = keras.optimizers.SGD(LR)
    init = [v.numpy() for v in model.trainable_variables]
    head = model.layers[-1]

    def train_step(x, y):
        with tf.GradientTape() as tape:
            loss = mse(model(x, training=True), y)
        tape = hvd.PartialDistributedGradientTape(tape, local_layers=[head])
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables))

    step = maybe_function(train_step, mode)
    for s in range(STEPS):
        step(*map(tf.constant, batch(hvd.rank(), s)))

    sim = dense_model()

    def grads_of(weights, r, s):
        for v, w in zip(sim.trainable_variables, weights):
            v.assign(w)
        x, y = batch(r, s)
        with tf.GradientTape() as tape:
            loss = mse(sim(x, training=True), y)
        return [g.numpy() for g in tape.gradient(loss, sim.trainable_variables)]

    local_idx = {i for i, v in enumerate(model.trainable_variables) if any(v is h for h in head.trainable_variables)}
    expected = simulate_local(hvd.size(), hvd.rank(), init, local_idx, grads_of)
    shared = [v for i, v in enumerate(model.trainable_variables) if i not in local_idx]
    return (model.trainable_variables, [tf.constant(w) for w in expected],
            {"shared_digest": digest(shared), "local_count": len(local_idx)})


def register_local_source_case(mode):
    """DistributedGradientTape.register_local_source on a plain tf.Variable (the bias stays local)."""
    w, b = linear_vars()
    init = [w.numpy(), b.numpy()]
    step = maybe_function(linear_train_step(w, b, local_source=b), mode)
    for s in range(STEPS):
        step(*map(tf.constant, batch(hvd.rank(), s)))
    sw, sb = linear_vars()

    def grads_of(weights, r, s):
        sw.assign(weights[0])
        sb.assign(weights[1])
        x, y = batch(r, s)
        with tf.GradientTape() as tape:
            loss = linear_loss(sw, sb, x, y)
        return [g.numpy() for g in tape.gradient(loss, [sw, sb])]

    expected = simulate_local(hvd.size(), hvd.rank(), init, {1}, grads_of)
    return [w, b], [tf.constant(v) for v in expected], {"shared_digest": digest([w])}


# --- broadcast_variables -------------------------------------------------------------------------------


def broadcast_keras_case(mode):
    """Every rank starts from its own weights; after the broadcast all hold rank 0's."""
    model = dense_model()
    set_weights(model, k=10.0 * hvd.rank())

    def sync():
        hvd.broadcast_variables(model.variables, root_rank=0)

    maybe_function(sync, mode)()
    ref = dense_model()
    set_weights(ref, k=0.0)
    return model.variables, ref.variables, {}


def broadcast_tf_variable_case(mode):
    vs = [tf.Variable(closed_form((3, 2), 5 + hvd.rank())), tf.Variable(closed_form((2,), 7 + hvd.rank()))]

    def sync():
        hvd.broadcast_variables(vs, root_rank=0)

    maybe_function(sync, mode)()
    return vs, [tf.constant(closed_form((3, 2), 5)), tf.constant(closed_form((2,), 7))], {}


# --- SyncBatchNormalization ----------------------------------------------------------------------------


def bn_batch(rank, step, uneven=False):
    n = B + 2 * rank if uneven else B
    x = np.cos(np.arange(n * 3, dtype=np.float64) * (0.3 + rank) + step).reshape(n, 3) * (1 + rank)
    return x.astype(np.float32)


def sync_bn_case(mode, uneven=False):
    """Two training calls; moving statistics and outputs equal BatchNormalization on the global batch.

    ``uneven``: rank r has B + 2r samples (an epoch's last batch), so an unweighted average is wrong.
    """
    layer = hvd.SyncBatchNormalization(momentum=0.5)
    ref = keras.layers.BatchNormalization(momentum=0.5)
    call = maybe_function(lambda x: layer(x, training=True), mode)
    diffs = []
    for s in range(STEPS):
        parts = [bn_batch(r, s, uneven) for r in range(hvd.size())]
        out = call(tf.constant(parts[hvd.rank()]))
        start = sum(len(p) for p in parts[:hvd.rank()])
        ref_out = ref(np.concatenate(parts), training=True).numpy()[start:start + len(parts[hvd.rank()])]
        diffs.append(float(np.max(np.abs(out.numpy() - ref_out))))
    stats = [layer.moving_mean, layer.moving_variance]
    return stats, [ref.moving_mean, ref.moving_variance], {"output_diff": max(diffs)}


CASES = {
    "tape_keras_dense": lambda m: keras_tape_case(m, dense_model, batch),
    "tape_keras_groups": lambda m: keras_tape_case(
        m, dense_model, batch, groups_of=lambda model: [[layer.kernel for layer in model.layers]]),
    "tape_tf_variable": lambda m: tf_variable_case(m),
    "tape_embedding_sparse": lambda m: keras_tape_case(m, embedding_model, token_batch),
    "tape_embedding_sparse_as_dense": lambda m: keras_tape_case(m, embedding_model, token_batch, sparse_as_dense=True),
    "tape_fp16_compression": fp16_case,
    "distributed_optimizer_keras3": distributed_optimizer_case,
    "partial_tape_local_layer": partial_tape_case,
    "register_local_source": register_local_source_case,
    "broadcast_keras_model": broadcast_keras_case,
    "broadcast_tf_variables": broadcast_tf_variable_case,
    "sync_batch_norm": sync_bn_case,
    "sync_batch_norm_uneven_batches": lambda m: sync_bn_case(m, uneven=True),
}


def object_cases():
    """broadcast_object with the value only on the root, allgather_object of a different type per rank.

    Last in the script: on an engine that names these collectives after the object's type, the ranks
    wait on different names forever.
    """
    config = {"lr": 0.1, "steps": [1, 2, 3]}
    got = hvd.broadcast_object(config if hvd.rank() == 0 else None, root_rank=0)
    mine = {"rank": hvd.rank()} if hvd.rank() % 2 == 0 else [hvd.rank()]
    return {"broadcast_object_root_only": got, "allgather_object_mixed_types": hvd.allgather_object(mine)}


def main(out):
    hvd.init()
    record = {"rank": hvd.rank(), "size": hvd.size(), "cases": {}}
    for name, case in CASES.items():
        for mode in ("eager", "function"):
            entry = {}
            try:
                got, expected, extra = case(mode)
                entry.update(extra)
                entry["digest"] = digest(got)
                entry["max_diff"] = float(np.max(np.abs(params(got) - params(expected))))
            except Exception as e:  # recorded: the test names the case and the error
                entry["error"] = f"{type(e).__name__}: {e}"[:600]
                entry["traceback"] = traceback.format_exc()[-2000:]
            record["cases"][f"{name}/{mode}"] = entry
    record["objects"] = object_cases()
    with open(os.path.join(out, f"rank{hvd.rank()}.json"), "w") as f:
        json.dump(record, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
