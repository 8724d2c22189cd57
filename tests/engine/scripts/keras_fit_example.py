"""A TF2 Keras training script in the shape of Horovod's public example (tensorflow2_keras_mnist.py).

Generated MNIST-shaped data instead of a download; everything else is Horovod's recipe: scale the
learning rate by the number of workers, wrap the optimizer in hvd.DistributedOptimizer, broadcast
rank 0's initial state, average the metrics, warm the learning rate up, checkpoint on rank 0 only.
The one Keras 3 change: compile() no longer takes experimental_run_tf_function=False.

Usage: python keras_fit_example.py [--epochs N] [--checkpoint-dir DIR]
"""

import argparse
import hashlib
import os

import numpy as np
import tensorflow as tf

import horovod.tensorflow.keras as hvd

parser = argparse.ArgumentParser(description="TF2 Keras example on generated data")
parser.add_argument("--epochs", type=int, default=4)
parser.add_argument("--checkpoint-dir", default=".")
args = parser.parse_args()

# Horovod: initialize Horovod.
hvd.init()

# Horovod: pin GPU to be used to process local rank (one GPU per process).
gpus = tf.config.experimental.list_physical_devices("GPU")
for gpu in gpus:
    tf.config.experimental.set_memory_growth(gpu, True)
if gpus:
    tf.config.experimental.set_visible_devices(gpus[hvd.local_rank()], "GPU")

# Generated data: each worker its own images; the label is a fixed function of the image.
rng = np.random.RandomState(hvd.rank())
images = rng.rand(1024, 28, 28, 1).astype("float32")
projection = np.random.RandomState(1234).randn(28 * 28, 10).astype("float32")
labels = np.argmax(images.reshape(len(images), -1) @ projection, axis=1).astype("int64")

dataset = tf.data.Dataset.from_tensor_slices((images, labels))
dataset = dataset.repeat().shuffle(1000, seed=hvd.rank()).batch(32)

tf.keras.utils.set_random_seed(hvd.rank())  # different initial weights: the broadcast must fix them
mnist_model = tf.keras.Sequential([
    tf.keras.Input((28, 28, 1)),
    tf.keras.layers.Conv2D(8, [3, 3], activation="relu"),
    tf.keras.layers.MaxPooling2D(pool_size=(2, 2)),
    tf.keras.layers.Flatten(),
    tf.keras.layers.Dense(64, activation="relu"),
    tf.keras.layers.Dense(10, activation="softmax"),
])

# Horovod: adjust learning rate based on number of GPUs.
scaled_lr = 0.002 * hvd.size()
opt = tf.optimizers.Adam(scaled_lr)

# Horovod: add Horovod DistributedOptimizer.
opt = hvd.DistributedOptimizer(opt)

mnist_model.compile(loss=tf.losses.SparseCategoricalCrossentropy(), optimizer=opt, metrics=["accuracy"])

callbacks = [
    # Horovod: broadcast initial variable states from rank 0 to all other processes.
    hvd.callbacks.BroadcastGlobalVariablesCallback(0),
    # Horovod: average metrics among workers at the end of every epoch.
    hvd.callbacks.MetricAverageCallback(),
    # Horovod: using `lr = 1.0 * hvd.size()` from the very beginning leads to worse final accuracy.
    # Scale the learning rate `lr = 1.0` ---> `lr = 1.0 * hvd.size()` during the first epochs.
    hvd.callbacks.LearningRateWarmupCallback(initial_lr=scaled_lr, warmup_epochs=2, verbose=1),
]

# Horovod: save checkpoints only on worker 0 to prevent other workers from corrupting them.
if hvd.rank() == 0:
    callbacks.append(tf.keras.callbacks.ModelCheckpoint(os.path.join(args.checkpoint_dir, "checkpoint-{epoch}.keras")))

# Horovod: write logs on worker 0.
verbose = 1 if hvd.rank() == 0 else 0

# Train the model.
# Horovod: adjust number of steps based on number of GPUs.
history = mnist_model.fit(dataset, steps_per_epoch=32 // hvd.size(), callbacks=callbacks, epochs=args.epochs,
                          verbose=verbose)

weights = np.concatenate([np.ravel(w) for w in mnist_model.get_weights()])
print("worker %d of %d done: loss %.4f -> %.4f, accuracy %.4f, weights sha256 %s" % (
    hvd.rank(), hvd.size(), history.history["loss"][0], history.history["loss"][-1],
    history.history["accuracy"][-1], hashlib.sha256(weights.tobytes()).hexdigest()[:16]), flush=True)
