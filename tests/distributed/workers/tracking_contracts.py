"""Runs on every rank of a real 2-rank job: trains on uneven shards and tracks the averaged metrics.

Every rank passes the same log directory to the tracker; only rank 0 may write there. Each rank
records what it saw in OUT/rank<r>.json; tests/distributed/test_tracking_contracts.py reads the event file
and the MLflow store back and checks the values against the metrics over all ten samples.
Data: 10 samples, rank 0 holds 0..6 and rank 1 holds 7..9 (uneven on purpose).
Usage: python tracking_contracts.py torch|keras OUT
"""

import os
import sys

from recording import error_of, write_rank_result

EPOCHS = 3
PARAMS = {"lr": 0.05, "batch_size": 4, "model": "tiny"}


def mine(rank):
    return range(0, 7) if rank == 0 else range(7, 10)


def torch_job(out_dir):
    """A tiny loop: a 1-weight linear model predicts x_i = i; the target at epoch e is e.

    Per sample: loss (i - e)^2, correct when i > e + 4. The metric sums and counts are averaged
    with ``hk.average_metrics`` and logged with ``hk.Tracker``.
    """
    import torch

    import hvdkit.torch as hk
    from hvdkit.core import ConfigError

    topo = hk.init()
    model = torch.nn.Linear(1, 1, bias=False).double()
    torch.nn.init.ones_(model.weight)
    x = torch.tensor([float(i) for i in mine(topo.rank)], dtype=torch.float64).reshape(-1, 1)
    local = []
    with hk.Tracker(os.path.join(out_dir, "runs"), backends=("tensorboard", "mlflow"), params=PARAMS) as tracker:
        for epoch in range(EPOCHS):
            metrics = hk.MetricTracker(["loss", "accuracy"])
            for batch in torch.split(x, PARAMS["batch_size"]):  # 2 batches on rank 0, 1 on rank 1
                with torch.no_grad():
                    pred = model(batch)
                metrics.update_sum("loss", float(((pred - epoch) ** 2).sum()), len(batch))
                metrics.update_sum("accuracy", float((pred > epoch + 4).sum()), len(batch))
            local.append({k: t / c for k, (t, c) in metrics.local().items()})
            tracker.log_metrics(hk.average_metrics(metrics), step=epoch)  # collective, then rank 0 writes
        nan_error = error_of(lambda: tracker.log_metrics({"loss": float("nan")}, step=EPOCHS), ConfigError)
    return topo, tracker, {"local": local, "nan_error": nan_error}


def keras_job(out_dir):
    """``model.fit`` on 7/3 shards with MetricAverageCallback, then TrackMetricsCallback.

    The reference for each epoch is computed on every rank, without collectives, from all ten
    samples: training metrics with the weights at the start of the epoch (one step per epoch),
    validation metrics with the weights at its end.
    """
    import keras
    import numpy as np

    import hvdkit.keras as hk

    topo = hk.init()
    g = np.random.RandomState(7)
    x_all = g.randn(10, 8).astype("float32")
    y_all = g.randint(0, 4, size=10)
    idx = list(mine(topo.rank))
    x, y = x_all[idx], y_all[idx]
    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [keras.Input((8,)), keras.layers.Dense(16, activation="tanh"), keras.layers.Dense(4, activation="softmax")]
    )
    model.compile(
        optimizer=hk.DistributedOptimizer(keras.optimizers.SGD(PARAMS["lr"])),
        loss="sparse_categorical_crossentropy",
        metrics=["accuracy"],
    )

    def metrics_of(xs, ys):
        p = model(xs, training=False)
        loss = keras.losses.sparse_categorical_crossentropy(ys, p)
        return {
            "loss": float(np.mean(keras.ops.convert_to_numpy(loss))),
            "accuracy": float(np.mean(np.argmax(keras.ops.convert_to_numpy(p), axis=1) == ys)),
        }

    reference, local = [], []

    def begin(epoch, logs):
        reference.append(metrics_of(x_all, y_all))
        local.append(metrics_of(x, y))

    def end(epoch, logs):
        reference[-1].update({f"val_{k}": v for k, v in metrics_of(x_all, y_all).items()})

    record = keras.callbacks.LambdaCallback(on_epoch_begin=begin, on_epoch_end=end)
    track = hk.TrackMetricsCallback(os.path.join(out_dir, "runs"), backends=("tensorboard", "mlflow"), params=PARAMS)
    hist = model.fit(
        x,
        y,
        batch_size=len(idx),
        epochs=EPOCHS,
        shuffle=False,
        verbose=0,
        validation_data=(x, y),
        validation_batch_size=len(idx),
        callbacks=[hk.BroadcastInitialStateCallback(), record, hk.MetricAverageCallback(), track],
    )
    history = {k: [float(v) for v in vs] for k, vs in hist.history.items()}
    return topo, track.tracker, {"reference": reference, "local": local, "history": history}


def main(framework, out_dir):
    topo, tracker, extra = (torch_job if framework == "torch" else keras_job)(out_dir)
    record = {
        "rank": topo.rank,
        "size": topo.size,
        "pid": os.getpid(),
        "event_file": tracker.event_file,
        "run_id": tracker.mlflow_run_id,
        "closed": tracker.closed,
        "params": {k: str(v) for k, v in tracker.params.items()},
        **extra,
    }
    write_rank_result(out_dir, topo.rank, record)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
