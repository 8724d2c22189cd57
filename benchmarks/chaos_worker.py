"""The training script of ``python -m benchmarks chaos``: ``hk.Trainer`` on the digits data (or a
~100 MB MLP), logging which samples every optimizer step trained on.

    hvdkit run -np 2 ... -- python benchmarks/chaos_worker.py OUT [--model digits|big] [--commit-every K] ...

Each rank process appends one JSON line per optimizer step to ``OUT/steps/<pid>.jsonl``:
``{"t", "pid", "rank", "size", "epoch", "step", "ids"}`` (``t``: time.time() after the step;
``ids``: the dataset indices this rank trained on in that step, read from the batches the loader
fetched). Every rank stops after the same step once ``OUT/stop`` exists (``stop_training``). With
``--pace`` each step sleeps that long after it (keeps the 2 shared cores usable, like a longer step).
Rank 0 prints a progress line every ``--report-every`` epochs.
"""

import argparse
import inspect
import json
import os
import sys
import time

import torch
from torch.utils.data import Dataset

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples"))

from digits_common import load_split  # noqa: E402

import hvdkit.torch as hk  # noqa: E402

MODELS = ("digits", "big")


class Indexed(Dataset):
    """``(x, y)`` samples whose indices the loader fetched, batch by batch (``__getitems__``)."""

    def __init__(self, x, y):
        self.x, self.y, self.batches = x, y, []

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        return self.x[i], self.y[i]

    def __getitems__(self, indices):
        self.batches.append([int(i) for i in indices])
        return [(self.x[i], self.y[i]) for i in indices]

    def take(self, micro_batches):
        """The indices of the last ``micro_batches`` batches fetched (one optimizer step); forget all.

        Batches fetched before those belong to a step that never finished (a recovery went back
        to a commit): they are dropped, as the step they fed was.
        """
        ids = [i for batch in self.batches[-micro_batches:] for i in batch]
        self.batches = []
        return ids


class StepLog:
    """A Trainer callback: one line per optimizer step (see the module's docstring); stop on OUT/stop."""

    def __init__(self, out, data, pace, report_every):
        self.out, self.data, self.pace, self.report_every = out, data, pace, report_every
        self.path = os.path.join(out, "steps", f"{os.getpid()}.jsonl")
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        self.stop_file = os.path.join(out, "stop")
        self.trainer = None

    def on_train_begin(self, trainer):
        self.trainer = trainer

    def on_train_batch_end(self, step, logs):
        trainer = self.trainer
        comm = trainer.comm
        ids = self.data.take(trainer.accumulation)
        line = {"t": time.time(), "pid": os.getpid(), "rank": comm.rank, "size": comm.size}
        line.update(epoch=trainer.epoch, step=step, ids=ids)
        with open(self.path, "a") as f:
            f.write(json.dumps(line, separators=(",", ":")) + "\n")
        if self.pace:
            time.sleep(self.pace)
        if os.path.exists(self.stop_file):
            trainer.stop_training = True

    def on_epoch_end(self, epoch, logs):
        if self.trainer.comm.rank == 0 and (epoch + 1) % self.report_every == 0:
            print(f"chaos worker: epoch {epoch + 1} done, loss {logs['loss']:.4f}", flush=True)


def model_of(name):
    """The digits examples' MLP (64 -> 128 -> 64 -> 10), or one of about 100 MB (64 -> 5000 -> 5000 -> 10)."""
    torch.manual_seed(0)
    width = {"digits": (128, 64), "big": (5000, 5000)}[name]
    return torch.nn.Sequential(
        torch.nn.Linear(64, width[0]),
        torch.nn.ReLU(),
        torch.nn.Linear(*width),
        torch.nn.ReLU(),
        torch.nn.Linear(width[1], 10),
    )


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out")
    p.add_argument("--model", choices=MODELS, default="digits")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--global-batch-size", type=int, default=64)
    p.add_argument("--checkpoint-every", type=int, default=20, help="optimizer steps between checkpoints")
    p.add_argument("--commit-every", type=int, default=None, help="in-memory commits (in-process recovery)")
    p.add_argument("--pace", type=float, default=0.05)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--report-every", type=int, default=20)
    return p.parse_args(argv)


def main(argv=None):
    args = parse(argv)
    x, y, _, _ = load_split(args.seed)
    data = Indexed(torch.from_numpy(x), torch.from_numpy(y))
    model = model_of(args.model)
    extra = {}
    if args.commit_every is not None:
        if "commit_every" not in inspect.signature(hk.Trainer).parameters:
            sys.exit("chaos worker: --commit-every needs hk.Trainer(commit_every=...), which this hvdkit lacks")
        extra["commit_every"] = args.commit_every
    trainer = hk.Trainer(
        model,
        torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
        torch.nn.functional.cross_entropy,
        batch_size=args.batch_size,
        global_batch_size=args.global_batch_size,
        checkpoint_dir=os.path.join(args.out, "ckpt"),
        checkpoint_every=args.checkpoint_every,
        keep=2,
        compression="none",
        progress=False,
        seed=args.seed,
        callbacks=[StepLog(args.out, data, args.pace, args.report_every)],
        **extra,
    )
    trainer.fit(data, epochs=10**6)


if __name__ == "__main__":
    main()
