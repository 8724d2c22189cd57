"""Keras ``model.fit`` through ``hk.elastic.fit`` on the digits data (docs/elastic.md, "In-process recovery").

    keras_elastic_fit.py OUT [--epochs 3] [--sample-log PREFIX] [--kill MARKER:RANK:STEP] [--wait-for-join]
                         [--checkpoint-dir DIR] [--term MARKER:RANK:STEP] [--pace SECONDS] [--mixed-precision]
                         [--zero]

Global batch 64 = 32 per rank x 2 ranks (1 rank: 2 accumulation steps), SGD with momentum, a commit every 5
optimizer steps and at every epoch end. ``--kill``: the process that is rank RANK SIGKILLs itself right after
optimizer step STEP (before that step's commit, if any), once per job (MARKER, made with O_EXCL).
``--wait-for-join``: at 1 rank, the survivor waits (at most 240 s) after each step until Horovod's driver
tells it that a worker is ready to join (the new process engine fix 09 starts in the lost worker's slot), so
that the next commit takes it in. ``--checkpoint-dir``: an ``hk.CheckpointCallback`` there in ``fit``'s callbacks
(``hk.elastic.fit`` resumes from it and checkpoints a stop). ``--term``: the process that is rank RANK sends
SIGTERM to the job's ``hvdkit run`` right after optimizer step STEP, once per job (MARKER), as a scheduler
preempting the job does (kill_in_process.py's ``term:``). ``--pace``: every rank sleeps SECONDS after each
optimizer step. ``--mixed-precision``: the ``mixed_float16`` policy, and a dynamic loss scale from 1 that doubles
after every 5 good steps (hk.DistributedOptimizer's loss-scale optimizer); every rank prints its loss scale and
count of good steps at the end. ``--zero``: the optimizer state sharded (``shard_optimizer_state=True``, ZeRO-1);
every rank prints how many elements its optimizer's momentum slices hold at the end. Every rank prints where it imports hvdkit from, and after a stop the step it stopped after; at
the end every rank writes its weights to OUT.rank<r>.npz and prints its process id and rank, and rank 0 prints
one JSON line (with the History's logged metrics of every epoch).
"""

import argparse
import json
import os
import signal
import sys
import time

import keras
import numpy as np
import tensorflow as tf

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "examples"))
from digits_common import SampleLog, keras_model, load_split  # noqa: E402

import hvdkit  # noqa: E402
import hvdkit.keras as hk  # noqa: E402

JOIN_WAIT_S = 240


class Kill(keras.callbacks.Callback):
    """Rank RANK, after optimizer step STEP, once per job (MARKER): ``act`` (SIGKILL to itself)."""

    def __init__(self, spec):
        super().__init__()
        self.marker, rank, step = spec.rsplit(":", 2)
        self.rank, self.step = int(rank), int(step)

    def on_train_batch_end(self, batch, logs=None):
        step = int(self.model.optimizer.iterations.numpy())
        if step < self.step or hk.rank() != self.rank or os.path.exists(self.marker):
            return
        try:
            os.close(os.open(self.marker, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
        except FileExistsError:
            return
        self.act(step)

    def act(self, step):
        print(f"keras_elastic_fit: rank {hk.rank()} kills itself after step {step} (process {os.getpid()})", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)


class Term(Kill):
    """Rank RANK, after optimizer step STEP: SIGTERM to the `hvdkit run` above this process (once per job)."""

    def act(self, step):
        from kill_in_process import _term_hvdkit_run  # this script's folder is on sys.path

        print(f"keras_elastic_fit: rank {hk.rank()} preempts the job after step {step}", flush=True)
        _term_hvdkit_run()


class Pace(keras.callbacks.Callback):
    def __init__(self, seconds):
        super().__init__()
        self.seconds = seconds

    def on_train_batch_end(self, batch, logs=None):
        time.sleep(self.seconds)  # a step the stop signal reaches every rank within


class Notices:
    """Horovod's notification listener: a worker is ready to join (a notice that slots were added)."""

    def __init__(self):
        self.heard = 0

    def on_hosts_updated(self, timestamp, update_res):
        from horovod.runner.elastic.worker import HostUpdateResult

        if int(update_res) & int(HostUpdateResult.added):
            self.heard += 1


class WaitForJoin(keras.callbacks.Callback):
    def __init__(self, notices):
        super().__init__()
        self.notices = notices

    def on_train_batch_end(self, batch, logs=None):
        t0 = time.monotonic()
        while hk.size() == 1 and not self.notices.heard:
            if time.monotonic() - t0 > JOIN_WAIT_S:
                raise RuntimeError(f"no worker was reported ready to join within {JOIN_WAIT_S} s")
            time.sleep(0.2)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--sample-log", default=None)
    p.add_argument("--kill", default=None)
    p.add_argument("--wait-for-join", action="store_true")
    p.add_argument("--checkpoint-dir", default=None)
    p.add_argument("--term", default=None)
    p.add_argument("--pace", type=float, default=0.0)
    p.add_argument("--mixed-precision", action="store_true")
    p.add_argument("--zero", action="store_true")
    args = p.parse_args()
    hk.init()
    print(f"keras_elastic_fit: process {os.getpid()} imports hvdkit from {hvdkit.__file__}", flush=True)
    keras.utils.set_random_seed(0)
    x_train, y_train, x_val, y_val = load_split(0)
    opt = keras.optimizers.SGD(0.05, momentum=0.9)
    if args.mixed_precision:  # the scale grows within the run (from 1: no overflow in it) and differs per step
        keras.mixed_precision.set_global_policy("mixed_float16")
        opt = keras.optimizers.LossScaleOptimizer(opt, initial_scale=1.0, dynamic_growth_steps=5)
    model = keras_model()
    model.compile(
        optimizer=hk.DistributedOptimizer(opt, shard_optimizer_state=args.zero),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    callbacks = [hk.MetricAverageCallback()]
    if args.kill:
        callbacks.append(Kill(args.kill))
    if args.term:
        callbacks.append(Term(args.term))
    if args.pace:
        callbacks.append(Pace(args.pace))
    if args.checkpoint_dir:
        callbacks.append(hk.CheckpointCallback(args.checkpoint_dir, model))
    if args.wait_for_join:
        from horovod.common.elastic import notification_manager

        notices = Notices()
        notification_manager.init()
        notification_manager.register_listener(notices)
        callbacks.append(WaitForJoin(notices))
    log = SampleLog(args.sample_log, hk.rank, hk.size)
    history = hk.elastic.fit(
        model, (x_train, y_train), batch_size=32, global_batch_size=64, epochs=args.epochs, seed=0,
        commit_every=5, callbacks=callbacks, on_step=log.write,
    )  # fmt: skip
    steps = int(model.optimizer.iterations.numpy())
    if history.stopped:  # every rank says where it stopped; exit 0
        print(f"keras_elastic_fit: rank {hk.rank()} of {hk.size()} stopped after step {steps}", flush=True)
    val = hk.shard(tf.data.Dataset.from_tensor_slices((x_val, y_val)), even=False).batch(256)  # at the size now
    model.evaluate(val, verbose=0)
    final = hk.average_model_metrics(model)
    np.savez(f"{args.out}.rank{hk.rank()}.npz", *[np.asarray(w) for w in model.get_weights()])
    if args.mixed_precision:
        scale, good = float(model.optimizer.dynamic_scale.numpy()), int(model.optimizer.step_counter.numpy())
        print(f"keras_elastic_fit: rank {hk.rank()} ends with loss scale {scale!r} after {good} good steps", flush=True)
    if args.zero:
        held = sum(int(np.prod(v.shape)) for v in model.optimizer.variables if v.name.endswith("_momentum"))
        print(f"keras_elastic_fit: rank {hk.rank()} holds {held} momentum elements", flush=True)
    print(f"keras_elastic_fit: process {os.getpid()} ends as rank {hk.rank()} of {hk.size()}", flush=True)
    if hk.rank() == 0:
        result = {
            "steps": steps,
            "size": hk.size(),
            "stopped": history.stopped,
            "resumed_from_epoch": history.resumed_from_epoch,
            "epochs": history.epoch,
            "history": history.history,  # each epoch's logged loss and accuracy (MetricAverageCallback's)
            "recoveries": [(r["cause"], r["from_size"], r["to_size"], r["resumed_step"]) for r in history.recoveries],
            "val_loss": final["loss"],
            "val_accuracy": final["accuracy"],
        }
        print("keras_elastic_fit: " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
