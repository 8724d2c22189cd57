"""Train an MLP on scikit-learn's bundled digits data with Keras 3 `model.fit` on N ranks.

    hvdkit run -np 2 -- python examples/keras_digits.py
    horovodrun -np 2 --gloo python examples/keras_digits.py

Gradients really averaged (hvdkit's DistributedOptimizer), fp16 compression, rank 0's initial
state broadcast, metrics averaged over all ranks' samples, a rank-0 checkpoint every epoch and
automatic resume at epoch boundaries, at any world size (``--global-batch-size`` keeps the maths:
the accumulation per rank adapts). SIGTERM or ``--stop-at-step`` stop at the end of the epoch.
Same flags and final JSON line as examples/torch_digits.py.
"""

import collections
import math
import sys

import keras
import tensorflow as tf
from digits_common import SampleLog, keras_model, load_split, log_epoch, result_line, run

import hvdkit.keras as hk
from hvdkit.core import get_logger

log = get_logger("examples.keras_digits")


class StopAtEpochEnd(keras.callbacks.Callback):
    """After SIGTERM on any rank (or at ``--stop-at-step``), stop at the end of the epoch: ``fit``
    resumes at epoch boundaries, and the Checkpoint callback before this one has saved it.

    Collective: every rank's ``fit`` has it (one tiny allreduce per epoch).
    """

    def __init__(self, stop_at_step=None):
        super().__init__()
        self.guard = hk.PreemptionGuard()
        self.stop_at_step = stop_at_step
        self.stopped = False

    def on_train_begin(self, logs=None):  # where this run resumed, and every step after: for hvdkit run's summary
        self.guard.progress(int(self.model.optimizer.iterations), resumed=True)

    def on_train_batch_end(self, batch, logs=None):
        self.guard.progress(int(self.model.optimizer.iterations))

    def on_epoch_end(self, epoch, logs=None):
        reached = self.stop_at_step is not None and int(self.model.optimizer.iterations) >= self.stop_at_step
        if self.guard.should_stop(step=int(self.model.optimizer.iterations)) or reached:
            self.model.stop_training = self.stopped = True


class StepSamples(keras.callbacks.Callback):
    """``--sample-log``: one line per optimizer step, written once its batches have been trained on.

    ``epoch_dataset`` announces each batch's indices (``on_batch``) when it prepares the epoch,
    ahead of training; they are queued, and ``fit``'s batch-end callback takes them in order, so
    a batch prepared but never trained (a stop at an epoch end) is never logged.
    """

    def __init__(self, log_file, accumulation):
        super().__init__()
        self.log_file, self.accumulation = log_file, accumulation
        self.steps_per_epoch = 0  # optimizer steps per epoch, set once epoch_dataset has said
        self.queue = collections.deque()
        self.pending, self.batches = [], 0

    def on_batch(self, epoch, step, indices):
        self.queue.append((epoch, step, indices))

    def on_train_batch_end(self, batch, logs=None):
        epoch, step, indices = self.queue.popleft()
        self.pending += indices
        self.batches += 1
        if self.batches == self.accumulation:
            self.log_file.write(epoch, epoch * self.steps_per_epoch + step + 1, self.pending)
            self.pending, self.batches = [], 0


def train(args):
    topo = hk.init()
    keras.utils.set_random_seed(args.seed)
    x_train, y_train, x_val, y_val = load_split(args.seed)
    val_ds = hk.shard(tf.data.Dataset.from_tensor_slices((x_val, y_val)), even=False).batch(256)
    # The global batch (if given) stays the same at any world size: the accumulation adapts.
    plan = hk.batch_plan(args.batch_size, args.global_batch_size)

    model = keras_model()
    lr = args.lr
    if args.lr_decay is not None:  # a schedule sees optimizer steps at any accumulation, so at any world size
        steps_per_epoch = math.ceil(len(x_train) / plan.global_batch_size)
        lr = keras.optimizers.schedules.ExponentialDecay(args.lr, decay_steps=steps_per_epoch, decay_rate=args.lr_decay)
    optimizer = hk.DistributedOptimizer(
        keras.optimizers.SGD(lr, momentum=0.9), compression=args.compression, backward_passes_per_step=plan.accumulation
    )
    model.compile(
        optimizer=optimizer,
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    ckpt = hk.CheckpointCallback(args.checkpoint_dir, model, keep=args.keep, seed=args.seed)
    ckpt.restore()  # the newest good checkpoint (a Resumed), or None on a fresh start
    start_epoch = ckpt.initial_epoch
    # Epoch e's order depends on (seed, e) only, so a resumed run sees the batches an uninterrupted
    # one would, at any world size; every rank gets the same number of batches.
    samples = StepSamples(SampleLog(args.sample_log, topo.rank, topo.size), plan.accumulation)
    train_ds, steps = hk.epoch_dataset(
        (x_train, y_train),
        args.batch_size,
        args.epochs,
        start_epoch,
        seed=args.seed,
        global_batch_size=args.global_batch_size,
        on_batch=samples.on_batch if args.sample_log else None,
    )
    samples.steps_per_epoch = steps // plan.accumulation
    report = keras.callbacks.LambdaCallback(
        on_epoch_end=lambda epoch, logs: topo.is_rank0 and log_epoch(log, epoch, args.epochs, logs)
    )
    stop = StopAtEpochEnd(args.stop_at_step)
    callbacks = [
        hk.BroadcastInitialStateCallback(),
        hk.MetricAverageCallback(),
        hk.ProgressBarCallback(args.batch_size),
        report,
        ckpt,
        stop,
    ]
    model.fit(
        train_ds,
        steps_per_epoch=steps,
        validation_data=val_ds,
        epochs=args.epochs,
        initial_epoch=start_epoch,
        callbacks=callbacks + ([samples] if args.sample_log else []),
        verbose=0,
    )
    model.evaluate(val_ds, verbose=0)
    final = hk.average_model_metrics(model)
    if topo.is_rank0:
        steps = int(model.optimizer.iterations)
        line = result_line(
            topo.size,
            args,
            start_epoch,
            steps,
            final["accuracy"],
            final["loss"],
            preempted=stop.stopped,
            compression=optimizer.compression,
        )
        print(line, flush=True)


def main(argv=None):
    return run(train, __doc__, "keras_digits", argv)


if __name__ == "__main__":
    sys.exit(main())
