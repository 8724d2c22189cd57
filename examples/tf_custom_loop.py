"""Train an MLP on scikit-learn's bundled digits data with a TensorFlow custom loop on N ranks.

    hvdkit run -np 2 -- python examples/tf_custom_loop.py

A `tf.function` training step with hvdkit's DistributedGradientTape (fp16 compression), sharded
`tf.data`, sample-weighted metrics, a rank-0 checkpoint every epoch and automatic resume. Same
flags and final JSON line as examples/torch_digits.py.
"""

import sys
import time

import keras
import tensorflow as tf
from digits_common import keras_model, load_split, log_epoch, result_line, run

import hvdkit.tensorflow as htf
from hvdkit.core import MetricTracker, Progress, get_logger
from hvdkit.tensorflow import autocompress

log = get_logger("examples.tf_custom_loop")


def evaluate(model, dataset, loss_fn):
    """Validation loss and accuracy over the whole set (every rank calls it)."""
    tracker = MetricTracker(["val_loss", "val_accuracy"])
    for x, y in dataset:
        logits = model(x, training=False)
        n = int(tf.shape(y)[0])
        tracker.update_sum("val_loss", float(tf.reduce_sum(loss_fn(y, logits))), n)
        tracker.update_sum("val_accuracy", float(tf.reduce_sum(tf.cast(tf.argmax(logits, 1) == y, tf.float32))), n)
    return htf.average_metrics(tracker)


def train(args):
    topo = htf.init()
    keras.utils.set_random_seed(args.seed)
    x_train, y_train, x_val, y_val = load_split(args.seed)
    val_ds = htf.shard(tf.data.Dataset.from_tensor_slices((x_val, y_val)), even=False).batch(256)

    model = keras_model()
    optimizer = keras.optimizers.SGD(args.lr, momentum=0.9)
    optimizer.build(model.trainable_variables)
    per_sample = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none")
    # "auto" decided once, here, from the variables' shapes: a tape made inside the tf.function below
    # would measure again at every trace (the last, smaller batch traces a second time).
    compression = autocompress.resolve(args.compression, model.trainable_variables)
    ckpt = htf.Checkpointer(args.checkpoint_dir, model, optimizer, keep=args.keep)
    resumed = ckpt.restore()
    if resumed is None:
        htf.broadcast_variables(model.weights + optimizer.variables)
    start_epoch = resumed.epoch if resumed else 0

    @tf.function
    def step(x, y):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(per_sample(y, model(x, training=True)))
        tape = htf.DistributedGradientTape(tape, compression=compression)
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))
        return loss

    for epoch in range(start_epoch, args.epochs):
        t0 = time.perf_counter()
        # epoch e's order depends on (seed, e) only: a resumed run sees the same batches
        train_ds, steps_per_epoch = htf.epoch_dataset(
            (x_train, y_train), args.batch_size, epoch + 1, epoch, seed=args.seed
        )
        tracker = MetricTracker(["loss"])
        progress = Progress(steps_per_epoch, desc=f"epoch {epoch + 1}/{args.epochs}", show=topo.is_rank0)
        for x, y in train_ds:
            loss = step(x, y)
            n = int(tf.shape(y)[0])
            tracker.update("loss", float(loss), n)
            progress.update(1, samples=n * topo.size)
        progress.close()
        metrics = {**htf.average_metrics(tracker), **evaluate(model, val_ds, per_sample)}
        ckpt.save(step=int(optimizer.iterations), epoch=epoch + 1)
        if topo.is_rank0:
            log_epoch(log, epoch, args.epochs, metrics, time.perf_counter() - t0)

    final = evaluate(model, val_ds, per_sample)
    if topo.is_rank0:
        steps = int(optimizer.iterations)
        print(
            result_line(
                topo.size, args, start_epoch, steps, final["val_accuracy"], final["val_loss"], compression=compression
            ),
            flush=True,
        )


def main(argv=None):
    return run(train, __doc__, "tf_custom_loop", argv)


if __name__ == "__main__":
    sys.exit(main())
