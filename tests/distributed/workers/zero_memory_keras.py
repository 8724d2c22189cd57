"""Runs on every rank: what a Keras ZeRO-1 step (``shard_optimizer_state=True``) really allocates.

A model of one large kernel (``BIG`` fp32 elements, a dense gradient) and a small head. For each
kind, measured in this process's resident set (Linux ``VmRSS``/``VmHWM``, the peak reset through
``/proc/self/clear_refs``, as ``hvdkit.bench.zero_bench`` does; glibc told to serve every
allocation of 64 KiB or more by mmap and return it at once, TensorFlow's oneDNN allocator, which
keeps what it frees, switched off, so that the resident set follows the live tensors): what building
the optimizer and ``WARM`` steps added to the resident set, and how far one more ``apply`` raised
the peak above the resident set before it (the step's temporaries; the gradients already exist).
Kinds: ``sgd`` (plain SGD: its own update needs one slice-sized temporary), ``adam``, and
``sgd_graph`` (plain SGD, ``apply`` inside a ``tf.function``). ``small_rounds``: many rounds on a small
model, sharded against unsharded (``small_rounds``). Writes OUT/rank<r>.json.
"""

import os

os.environ["TF_ENABLE_ONEDNN_OPTS"] = "0"  # read when TensorFlow loads; its oneDNN allocator keeps freed memory

import ctypes  # noqa: E402
import gc  # noqa: E402
import json  # noqa: E402
import sys  # noqa: E402

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import hvdkit.keras as hk  # noqa: E402
from hvdkit.bench.zero_bench import proc_status, reset_peak  # noqa: E402
from hvdkit.core.zero import partition  # noqa: E402

IN, OUT = 2048, 8192  # the large kernel: BIG = 2**24 elements, 64 MiB of fp32
BIG = IN * OUT
ROUND = 1 << 17  # round_elements: 512 KiB of fp32 per round
WARM = 3


def exact_resident_set():
    """Make glibc serve every allocation of 64 KiB or more by mmap and return it to the system on free."""
    m_mmap_threshold = -3
    if ctypes.CDLL("libc.so.6").mallopt(m_mmap_threshold, 1 << 16) != 1:
        raise RuntimeError("mallopt(M_MMAP_THRESHOLD) refused")


def warm_up_engine():
    """Every collective kind once, so Horovod's own buffers exist before measuring."""
    import horovod.tensorflow as hvd

    small = [tf.ones([1 << 14]) for _ in range(2)]
    hvd.grouped_allreduce(small)
    hvd.grouped_reducescatter(small, op=hvd.Average)
    hvd.grouped_allgather(small, name="zero_memory_keras.warm.ag")


def make_model():
    keras.utils.set_random_seed(0)
    return keras.Sequential([keras.Input((IN,)), keras.layers.Dense(OUT), keras.layers.Dense(4)])


def gradients(model, rank, step):
    rng = np.random.default_rng(100 * step + rank)
    x = rng.standard_normal((8, IN)).astype("float32")
    y = rng.standard_normal((8, 4)).astype("float32")
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(tf.square(model(x, training=True) - y))
    return tape.gradient(loss, model.trainable_variables)


def make_optimizer(kind):
    inner = keras.optimizers.Adam(1e-3) if kind == "adam" else keras.optimizers.SGD(0.01)
    opt = hk.DistributedOptimizer(inner, shard_optimizer_state=True)
    opt.round_elements = ROUND  # (an attribute the code before the rounds ignores)
    return opt


def memory(kind, rank):
    """Resident growth from building the optimizer and WARM steps; one more step's peak above its start."""
    model = make_model()
    variables = model.trainable_variables
    grads = gradients(model, rank, 0)  # parameters and gradients exist, as in any run
    gc.collect()
    before = proc_status("VmRSS")
    opt = make_optimizer(kind)
    if kind == "sgd_graph":
        apply = tf.function(lambda gs: opt.apply(gs, variables))
    else:
        apply = lambda gs: opt.apply(gs, variables)  # noqa: E731
    for s in range(WARM):
        grads = gradients(model, rank, s)
        apply(grads)
    grads = gradients(model, rank, WARM)
    gc.collect()
    start = proc_status("VmRSS")
    assert reset_peak(), "this kernel does not reset VmHWM (/proc/self/clear_refs)"
    apply(grads)
    peak = proc_status("VmHWM")
    total = sum(int(np.prod(v.shape)) for v in variables)
    mine = partition(total, hk.size())[rank]
    return {
        "param_bytes": BIG * 4,
        "shard_bytes": (mine.stop - mine.start) * 4,
        "state_bytes": sum(int(np.prod(v.shape)) * 4 for v in opt.variables if len(v.shape) > 0),
        "resident_growth": start - before,
        "step_peak_over_start": peak - start,
        "rounds": getattr(opt, "last_rounds", None),
        "digest": float(np.sum(np.abs(model.layers[0].kernel.numpy()), dtype=np.float64)),
    }


def train_small(shard, rank):
    """4 Adam steps on a small model (3 eager, the last in a ``tf.function``); its weights and optimizer."""
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((7,)), keras.layers.Dense(5, activation="tanh"), keras.layers.Dense(3)])
    opt = hk.DistributedOptimizer(keras.optimizers.Adam(0.01), shard_optimizer_state=shard)
    if shard:
        opt.round_elements = 4

    def eager(grads):
        opt.apply(grads, model.trainable_variables)

    traced = tf.function(eager)
    for s in range(4):
        rng = np.random.default_rng(10 * s + rank)
        x, y = rng.standard_normal((4, 7)).astype("float32"), rng.standard_normal((4, 3)).astype("float32")
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(model(x, training=True) - y))
        (traced if s == 3 else eager)(tape.gradient(loss, model.trainable_variables))
    return [w.numpy() for w in model.trainable_weights], opt


def small_rounds(rank):
    """Sharded with ``round_elements=4`` (15 rounds, variables cut across them) against unsharded Adam."""
    sharded, opt = train_small(True, rank)
    plain, _ = train_small(False, rank)
    pairs = zip(sharded, plain, strict=True)
    return {
        "rounds": opt.last_rounds,
        "rel_diff": max(float(np.max(np.abs(a - b)) / np.max(np.abs(b))) for a, b in pairs),
        "digest": float(sum(np.sum(np.abs(w), dtype=np.float64) for w in sharded)),
    }


def main():
    out = sys.argv[1]
    exact_resident_set()
    hk.init()
    warm_up_engine()
    rank = hk.rank()
    memory("sgd", rank)  # once unmeasured: what a process allocates for good on its first steps
    result = {"size": hk.size(), "onednn": os.environ["TF_ENABLE_ONEDNN_OPTS"]}
    for kind in ("sgd", "adam", "sgd_graph"):
        result[kind] = memory(kind, rank)
    result["small_rounds"] = small_rounds(rank)
    with open(os.path.join(out, f"rank{rank}.json"), "w", encoding="utf-8") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main()
