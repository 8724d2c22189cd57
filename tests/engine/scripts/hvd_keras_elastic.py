"""A Horovod elastic Keras 3 script written against Horovod's public API only, as users write them.

    horovodrun -np 2 --min-np 1 --max-np 2 --host-discovery-script DISCOVER --gloo python hvd_keras_elastic.py OUT [events]

The same events as hvd_torch_elastic.py, in the same order (see elastic_hosts.py for OUT/hosts):
  1. at 2 ranks, after global step ``REMOVE_AT``, rank 0 removes the other host (of ``localhost`` and
     ``127.0.0.1``, the one it does not run on; its name goes to OUT/removed_host);
  2. at 1 rank, after 2 more steps, it adds that host back (a new worker joins);
  3. at 2 ranks again, the worker on that host kills itself (SIGKILL) once, after its step and
     before the commit: the survivor's next allreduce fails and it goes back to the last commit.
``hvd.elastic.KerasState`` holds the model, its SGD-with-momentum optimizer and ``epoch``, ``batch``,
``steps``; the callbacks commit after every batch. OUT/log gets one JSON line from every rank each
time ``fit`` begins (``start``: after a reset, the synced state) and one from rank 0 with what each
commit saves (``commit``); rank 0 writes OUT/result.json at the end, every rank
OUT/weights-<host>.json.
"""

import json
import os
import signal
import sys
import time

import horovod.tensorflow.keras as hvd
import keras
import numpy as np
from elastic_hosts import happened, mark, path, set_hosts, wait_for_the_join

EPOCHS, STEPS, BATCH = 3, 6, 4
REMOVE_AT = 3  # global steps at 2 ranks before the host is removed
EVENTS = sys.argv[2:] == ["events"]
HOST = os.environ.get("HOROVOD_HOSTNAME", "?")

hvd.init()
keras.utils.set_random_seed(0)
model = keras.Sequential([keras.Input((1,)), keras.layers.Dense(1, kernel_initializer="zeros")])
model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.01, momentum=0.9)), loss="mse")
state = hvd.elastic.KerasState(model, epoch=0, batch=0, steps=0)


def flat(variables):
    return [float(x) for v in variables for x in np.ravel(keras.ops.convert_to_numpy(v))]


def append(name, record):
    with open(path(name), "a") as f:
        f.write(json.dumps(record) + "\n")


def on_reset():
    append("resets", {"size": hvd.size()})


state.register_reset_callbacks([on_reset])


class Record(keras.callbacks.Callback):
    """Counts global steps and drives the events; logs each fit's start and what each commit saves."""

    def on_train_begin(self, logs=None):
        record = {"rank": hvd.rank(), "size": hvd.size(), "epoch": state.epoch, "batch": state.batch}
        append(
            "log", dict(record, event="start", weights=flat(model.weights), optimizer=flat(model.optimizer.variables))
        )

    def on_train_batch_end(self, batch, logs=None):
        state.steps += 1
        if EVENTS:
            events()
        self.committing()

    def on_epoch_end(self, epoch, logs=None):
        self.committing()

    def committing(self):
        if hvd.rank() == 0:  # CommitStateCallback, next, saves exactly this
            record = {"epoch": state.epoch, "batch": state.batch, "steps": state.steps}
            append(
                "log",
                dict(record, event="commit", weights=flat(model.weights), optimizer=flat(model.optimizer.variables)),
            )


def events():
    size = hvd.size()
    if hvd.rank() == 0 and size == 2 and state.steps >= REMOVE_AT and not happened("removed"):
        # the other host (Horovod orders hosts it discovers together by a set's order: rank 0 may be on either)
        with open(path("removed_host"), "w") as f:
            f.write("127.0.0.1" if HOST == "localhost" else "localhost")
        set_hosts(f"{HOST}:1\n", "removed")
    if hvd.rank() == 0 and size == 1 and happened("removed") and not happened("added"):
        if not hasattr(state, "added_after"):
            state.added_after = state.steps + 2
        if state.steps >= state.added_after:
            set_hosts("localhost:1\n127.0.0.1:1\n", "added")
    if size == 2 and happened("added") and HOST == open(path("removed_host")).read() and not happened("killed"):
        mark("killed")
        os.kill(os.getpid(), signal.SIGKILL)
    pending = (happened("removed") and size == 2 and not happened("added")) or (
        happened("added") and size == 1 and not happened("killed")
    )
    if pending:
        time.sleep(0.5)  # give host discovery time to see the change before the epochs run out


class JoinGate(keras.callbacks.Callback):
    """After the commit of a batch: hold the survivor until the added host is reported (elastic_hosts.py)."""

    def on_train_batch_end(self, batch, logs=None):
        if EVENTS:
            wait_for_the_join(state, hvd.size())


callbacks = [
    hvd.elastic.UpdateBatchStateCallback(state),
    hvd.elastic.UpdateEpochStateCallback(state),
    Record(),
    hvd.elastic.CommitStateCallback(state),
    JoinGate(),
]


@hvd.elastic.run
def train(state):
    x = np.linspace(0.0, 1.0, STEPS * BATCH, dtype="float32").reshape(-1, 1) + hvd.rank()
    y = 2.0 * x + 1.0
    model.fit(
        x, y, batch_size=BATCH, steps_per_epoch=STEPS, epochs=EPOCHS - state.epoch, callbacks=callbacks, verbose=0
    )


train(state)
if hvd.rank() == 0:
    with open(path("result.json"), "w") as f:
        iterations = int(model.optimizer.iterations.numpy())
        json.dump({"epoch": state.epoch, "batch": state.batch, "iterations": iterations, "size": hvd.size()}, f)
with open(path(f"weights-{HOST}.json"), "w") as f:
    json.dump(flat(model.weights), f)
print("DONE", hvd.rank(), hvd.size(), flush=True)
