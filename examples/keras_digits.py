"""Train an MLP on scikit-learn's bundled digits data with Keras 3 `model.fit` on N ranks.

    hvdkit run -np 2 -- python examples/keras_digits.py
    horovodrun -np 2 --gloo python examples/keras_digits.py

Gradients really averaged (hvdkit's DistributedOptimizer), fp16 compression, rank 0's initial
state broadcast, metrics averaged over all ranks' samples, a rank-0 checkpoint every epoch and
automatic resume. Same flags and final JSON line as examples/torch_digits.py.
"""

import sys

import keras
import tensorflow as tf
from digits_common import load_split, log_epoch, parse_args, result_line

import hvdkit.keras as hk
from hvdkit.core import HvdkitError, get_logger

log = get_logger("examples.keras_digits")


def build_model():
    return keras.Sequential(
        [
            keras.Input((64,)),
            keras.layers.Dense(128, activation="relu"),
            keras.layers.Dense(64, activation="relu"),
            keras.layers.Dense(10),
        ]
    )


def train(args):
    topo = hk.init()
    keras.utils.set_random_seed(args.seed)
    x_train, y_train, x_val, y_val = load_split(args.seed)
    val_ds = hk.shard(tf.data.Dataset.from_tensor_slices((x_val, y_val)), even=False).batch(256)

    model = build_model()
    optimizer = hk.DistributedOptimizer(keras.optimizers.SGD(args.lr, momentum=0.9), compression=args.compression)
    model.compile(
        optimizer=optimizer,
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    ckpt = hk.Checkpoint(args.checkpoint_dir, model, keep=args.keep)
    start_epoch = ckpt.restore()
    # Epoch e's order depends on (seed, e) only, so a resumed run sees the batches an uninterrupted
    # one would; every rank gets the same number of steps.
    train_ds, steps = hk.epoch_dataset((x_train, y_train), args.batch_size, args.epochs, start_epoch, seed=args.seed)
    report = keras.callbacks.LambdaCallback(
        on_epoch_end=lambda epoch, logs: topo.is_rank0 and log_epoch(log, epoch, args.epochs, logs)
    )
    model.fit(
        train_ds,
        steps_per_epoch=steps,
        validation_data=val_ds,
        epochs=args.epochs,
        initial_epoch=start_epoch,
        callbacks=[hk.BroadcastInitialState(), hk.MetricAverage(), hk.ProgressBar(args.batch_size), report, ckpt],
        verbose=0,
    )
    model.evaluate(val_ds, verbose=0)
    final = hk.average_model_metrics(model)
    if topo.is_rank0:
        steps = int(model.optimizer.iterations)
        print(result_line(topo.size, args, start_epoch, steps, final["accuracy"], final["loss"]), flush=True)


def main(argv=None):
    args = parse_args(__doc__.splitlines()[0], "checkpoints/keras_digits", argv)
    try:
        train(args)
    except HvdkitError as e:
        print(f"keras_digits: error: {e}", file=sys.stderr, flush=True)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
