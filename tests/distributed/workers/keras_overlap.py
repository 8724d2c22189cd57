"""Runs on every rank of a real 2-rank Keras job: the Keras optimizer with its allreduce split into groups.

For groups 1 (one grouped allreduce), 2, 3 and 0 (one per gradient), ``fit`` for a few steps from one
initial state; records a digest of the weights (bitwise comparison across ranks) and the largest
difference from one process trained on both ranks' batches together. Writes OUT/rank<r>.json.
Usage: python keras_overlap.py OUT
"""

import sys

import keras
import numpy as np
from model_params import keras_clone, keras_mlp, max_weight_diff, weights_digest
from recording import write_rank_result

import hvdkit.keras as hk
from hvdkit.tensorflow.gradients import _split

STEPS, B, LR = 3, 4, 0.1
GROUPS = (1, 2, 3, 0)


def make_model(seed=0):
    return keras_mlp(seed, hidden=(32, 16))


def clone(model, optimizer):
    twin = keras_clone(model, hidden=(32, 16))
    twin.compile(optimizer=optimizer, loss="mse")
    return twin


def main(out_dir):
    topo = hk.init(threads=1)
    g = np.random.RandomState(11)
    x = g.randn(STEPS, topo.size * B, 8).astype("float32")
    y = g.randn(STEPS, topo.size * B, 4).astype("float32")
    init = make_model()
    ref = clone(init, keras.optimizers.SGD(LR))
    ref.fit(x.reshape(-1, 8), y.reshape(-1, 4), batch_size=topo.size * B, shuffle=False, verbose=0)
    mine = slice(topo.rank * B, (topo.rank + 1) * B)
    out = {
        "rank": topo.rank,
        "moved": max_weight_diff(ref, init),
        "groups": {},
        "split_6_into_4": _split(list(range(6)), 4),
        "split_3_into_0": _split([0, 1, 2], 0),
    }
    for groups in GROUPS:
        opt = hk.DistributedOptimizer(keras.optimizers.SGD(LR))
        opt._hvdkit_groups = groups
        model = clone(init, opt)
        model.fit(
            np.concatenate([s[mine] for s in x]),
            np.concatenate([s[mine] for s in y]),
            batch_size=B,
            shuffle=False,
            verbose=0,
        )
        out["groups"][str(groups)] = {
            "digest": weights_digest(model),
            "max_diff_vs_reference": max_weight_diff(model, ref),
        }
    write_rank_result(out_dir, topo.rank, out)


if __name__ == "__main__":
    main(sys.argv[1])
