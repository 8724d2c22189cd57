"""Runs on every rank of a real 2-rank Keras job: ``fit`` for a balanced epoch, then one where rank 1 is slow.

A callback sleeps at every batch begin (longer on rank 1 in the second epoch); StragglerMonitorCallback must
name rank 1 then, and no rank in the first epoch. Writes OUT/rank<r>.json.
Usage: python straggler_keras.py OUT
"""

import sys
import time

import keras
import numpy as np
from recording import write_rank_result
from straggler_log import THRESHOLD, capture_straggler_log, compute_seconds

import hvdkit.keras as hk
from hvdkit.keras.optimizer import allreduce_seconds

STEPS = 12
B = 4


class SlowRank(keras.callbacks.Callback):
    """Sleeps at every batch begin: the rank's "compute"; rank 1 sleeps longer in epoch 1."""

    def __init__(self, rank):
        super().__init__()
        self.rank = rank
        self.epoch = 0

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_train_batch_begin(self, batch, logs=None):
        time.sleep(compute_seconds(self.rank, slowed=self.epoch == 1))


def main(out_dir):
    topo = hk.init()
    log_lines = capture_straggler_log()
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="tanh"), keras.layers.Dense(4)])
    model.compile(optimizer=hk.DistributedOptimizer(keras.optimizers.SGD(0.01)), loss="mse")
    g = np.random.RandomState(topo.rank)
    x, y = g.randn(STEPS * B, 8).astype("float32"), g.randn(STEPS * B, 4).astype("float32")
    report = hk.StragglerMonitorCallback(threshold=THRESHOLD)
    logs = []
    epoch_logs = keras.callbacks.LambdaCallback(
        on_epoch_end=lambda _epoch, _logs: (logs.append(list(log_lines)), log_lines.clear())
    )
    # SlowRank runs before StragglerMonitorCallback at batch begin: the report times from batch end to batch end.
    hist = model.fit(
        x,
        y,
        batch_size=B,
        epochs=2,
        shuffle=False,
        verbose=0,
        callbacks=[hk.BroadcastInitialStateCallback(), SlowRank(topo.rank), report, epoch_logs],
    )
    result = {
        "rank": topo.rank,
        "size": topo.size,
        "reports": [r.as_dict() for r in report.reports],
        "history_slowdown": [float(v) for v in hist.history["straggler_slowdown"]],
        "allreduce_seconds": allreduce_seconds(model.optimizer),
        "log": logs,
    }
    write_rank_result(out_dir, topo.rank, result)


if __name__ == "__main__":
    main(sys.argv[1])
