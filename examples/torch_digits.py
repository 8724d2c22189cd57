"""Train an MLP on scikit-learn's bundled digits data on N ranks with hvdkit's Trainer.

    hvdkit run -np 2 -- python examples/torch_digits.py
    mpirun -np 2 python examples/torch_digits.py          # the same, under plain mpirun
    horovodrun -np 2 --gloo python examples/torch_digits.py

One ``hk.Trainer(...).fit(...)`` call does the whole hvdkit path: it shards the data, averages the
gradients (compression "auto": fp16 when it is faster), averages the metrics exactly over all
samples, checkpoints every epoch on rank 0 and resumes from the newest checkpoint by itself. On
SIGTERM (preemption) or at ``--stop-at-step`` every rank stops after the same step and rank 0 saves
it with the epoch's global sample offset; the next start continues from there, at any world size
(``--global-batch-size`` keeps the maths: the accumulation per rank adapts). The same training with
its loop written out by hand, bitwise equal: examples/torch_digits_loop.py. Nothing is downloaded.
Ends with one JSON line on rank 0.
"""

import sys

import torch
import torch.nn.functional as F
from digits_common import SampleLog, result_line, run, torch_datasets, torch_model
from torch.utils.data import Dataset

import hvdkit.torch as hk


class StopAtStep:
    """``--stop-at-step N``: stop after optimizer step N as on SIGTERM (the Trainer checkpoints it)."""

    def __init__(self, step):
        self.step = step

    def on_train_begin(self, trainer):
        self.trainer = trainer

    def on_train_batch_end(self, step, logs):
        if step == self.step:
            self.trainer.stop_training = True


class LoggedSamples(Dataset):
    """The training set, noting which samples each optimizer step read (``--sample-log``).

    With ``num_workers=0`` (the Trainer's default) the loader reads a batch's samples just before
    training on it, so what was read since the last step is that step's samples.
    """

    def __init__(self, dataset, log):
        self.dataset, self.log, self.read = dataset, log, []

    def __len__(self):
        return len(self.dataset)

    def __getitem__(self, i):
        self.read.append(i)
        return self.dataset[i]

    def on_train_begin(self, trainer):  # again after an in-process recovery: what the cut step read is void
        self.trainer, self.read = trainer, []

    def on_train_batch_end(self, step, logs):
        self.log.write(self.trainer.epoch, step, self.read)
        self.read = []


def accuracy(out, y):
    return (out.argmax(1) == y).float().mean()


def train(args):
    hk.init()
    torch.manual_seed(args.seed)
    train_ds, val_ds = torch_datasets(args.seed)
    callbacks = [StopAtStep(args.stop_at_step)] if args.stop_at_step is not None else []
    if args.sample_log:
        train_ds = LoggedSamples(train_ds, SampleLog(args.sample_log, hk.rank, hk.size))
        callbacks.append(train_ds)
    model = torch_model()
    trainer = hk.Trainer(
        model,
        torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9),
        F.cross_entropy,
        metrics={"accuracy": accuracy},
        batch_size=args.batch_size,
        global_batch_size=args.global_batch_size,
        eval_batch_size=256,
        checkpoint_dir=args.checkpoint_dir,
        keep=args.keep,
        compression=args.compression,
        seed=args.seed,
        scheduler=lambda opt: torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=max(1, args.epochs)),
        callbacks=callbacks,
        shard_optimizer_state=args.shard_optimizer_state,
    )
    history = trainer.fit(train_ds, val_ds, epochs=args.epochs)
    final = {}
    if not history.stopped:  # the last epoch's metrics; a run with nothing left to train evaluates the model
        final = {k: v[-1] for k, v in history.history.items()} if history.epoch else trainer.evaluate(val_ds)
    if hk.is_rank0():  # asked now: after an in-process recovery another process may be rank 0
        print(
            result_line(
                hk.size(),
                args,
                history.resumed_from_epoch,
                history.step,
                final.get("val_accuracy"),
                final.get("val_loss"),
                preempted=history.stopped,
                compression=trainer.optimizer.compression,
            ),
            flush=True,
        )


def flags(parser):
    parser.add_argument(
        "--shard-optimizer-state",
        action="store_true",
        help="ZeRO-1: each rank keeps the optimizer state of its slice of the parameters only (the same maths)",
    )


def main(argv=None):
    return run(train, __doc__, "torch_digits", argv, add_flags=flags)


if __name__ == "__main__":
    sys.exit(main())
