"""Train the digits MLP on N ranks with hvdkit's Trainer: examples/torch_digits.py in one fit() call.

    hvdkit run -np 2 -- python examples/torch_trainer.py
    mpirun -np 2 python examples/torch_trainer.py          # the same, under plain mpirun

The same model, data, optimizer, schedule and sample order as torch_digits.py (whose loop is
written out by hand, for people who want their own): the Trainer shards the data, averages the
gradients (compression "auto"), averages the metrics exactly over all samples, checkpoints every
epoch on rank 0 and resumes from the newest checkpoint by itself, also after SIGTERM and at another
world size (``--global-batch-size`` keeps the maths). Ends with one JSON line on rank 0.
"""

import sys

import torch
import torch.nn.functional as F
from digits_common import result_line, run
from torch_digits import build_model, datasets

import hvdkit.torch as hk


def train(args):
    topo = hk.init()
    torch.manual_seed(args.seed)
    train_ds, val_ds = datasets(args.seed)
    model = build_model()
    trainer = hk.Trainer(
        model,
        torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9),
        F.cross_entropy,
        metrics={"accuracy": lambda out, y: (out.argmax(1) == y).float().mean()},
        batch_size=args.batch_size,
        global_batch_size=args.global_batch_size,
        eval_batch_size=256,
        checkpoint_dir=args.checkpoint_dir,
        keep=args.keep,
        compression=args.compression,
        seed=args.seed,
        scheduler=lambda opt: torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=max(1, args.epochs)),
    )
    history = trainer.fit(train_ds, val_ds, epochs=args.epochs)
    if topo.is_rank0:
        ran = bool(history.epoch) and not history.stopped
        accuracy = history.history["val_accuracy"][-1] if ran else None
        loss = history.history["val_loss"][-1] if ran else None
        print(
            result_line(
                topo.size,
                args,
                history.resumed_from_epoch,
                history.step,
                accuracy,
                loss,
                preempted=history.stopped,
                compression=trainer.optimizer.compression,
            ),
            flush=True,
        )


def main(argv=None):
    return run(train, __doc__, "torch_trainer", argv)


if __name__ == "__main__":
    sys.exit(main())
