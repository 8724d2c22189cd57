"""A digits model for ``hvdkit tune``: the flags a search sets, one report per epoch.

    hvdkit tune --space examples/tune_digits_space.yaml --metric val_loss --mode min --trials 10 --parallel 2 \\
        -np 1 -- python examples/tune_digits.py --epochs 6 --checkpoint-dir {trial_dir}/ckpt
    hvdkit run -np 2 -- python examples/tune_digits.py --lr 0.05 --momentum 0.9   # one trial by hand

The model, data split and metrics are examples/torch_digits.py's (``digits_common``); this script adds
the knobs worth searching (``--lr``, ``--momentum``, ``--weight-decay``, ``--batch-size``) and reports
each epoch to its trial with ``hvdkit.tune.report``: ``hk.Trainer`` already reports the epoch's metrics
(``loss``, ``val_loss``, ``val_accuracy``), and the callback adds ``val_error`` (1 - accuracy), so
``--metric val_error`` works too. Outside ``hvdkit tune`` the report does nothing. A pruned trial gets
the preemption stop: every rank stops after the same step, rank 0 checkpoints, all exit. Nothing is
downloaded. Ends with one JSON line on rank 0.
"""

import argparse
import json
import sys

import torch
import torch.nn.functional as F
from digits_common import torch_datasets, torch_model
from torch_digits import accuracy

import hvdkit.torch as hk
import hvdkit.tune
from hvdkit.core import HvdkitError


class ReportError:
    """Reports ``val_error`` after every epoch (rank 0's value counts; the others return at once)."""

    def on_epoch_end(self, epoch, logs):
        hvdkit.tune.report(epoch, val_error=1.0 - logs["val_accuracy"])


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--epochs", type=int, default=6)
    p.add_argument("--lr", type=float, default=0.05, help="SGD learning rate")
    p.add_argument("--momentum", type=float, default=0.9, help="SGD momentum")
    p.add_argument("--weight-decay", type=float, default=0.0, help="SGD weight decay (L2)")
    p.add_argument("--batch-size", type=int, default=32, help="per-rank batch size")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--compression", default="none", help="gradient compression: none, fp16, auto")
    p.add_argument("--checkpoint-dir", default=None, help="where rank 0 keeps checkpoints (a trial: {trial_dir}/ckpt)")
    return p.parse_args(argv)


def train(args):
    topo = hk.init()
    torch.manual_seed(args.seed)
    train_ds, val_ds = torch_datasets(args.seed)
    model = torch_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum, weight_decay=args.weight_decay)
    trainer = hk.Trainer(
        model,
        optimizer,
        F.cross_entropy,
        metrics={"accuracy": accuracy},
        batch_size=args.batch_size,
        eval_batch_size=256,
        checkpoint_dir=args.checkpoint_dir,
        compression=args.compression,
        seed=args.seed,
        callbacks=[ReportError()],
    )
    history = trainer.fit(train_ds, val_ds, epochs=args.epochs)
    final = {k: v[-1] for k, v in history.history.items()} if history.epoch else {}
    if topo.is_rank0:
        line = {"preempted": history.stopped, "world_size": topo.size, "epochs": args.epochs}
        line.update({k: round(float(final[k]), 6) for k in ("val_loss", "val_accuracy") if k in final})
        print(json.dumps(line), flush=True)


def main(argv=None):
    args = parse_args(argv)
    try:
        train(args)
    except HvdkitError as e:
        print(f"tune_digits: error: {e}", file=sys.stderr, flush=True)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
