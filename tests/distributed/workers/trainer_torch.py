"""Runs on every rank: ``hk.Trainer`` on the digits data with the example's model, optimizer and
schedule (examples/torch_digits_loop.py), so that its checkpoints compare with the example's manual loop.
Writes OUT/rank<r>.json: the history, and with ``--val-size`` the single-process validation values
of the final model over the whole validation subset (for the exact-metric check).

``--signal-at N``: rank 0 sends itself SIGTERM (preemption) or, with ``--kill``, SIGKILL at its
N-th training micro-batch, once per ``--once`` marker file (a SIGKILL only once the background
checkpoint write in flight, if any, is done: a kill during a write is tests/e2e/test_checkpoint_crashes.py's). Usage: python trainer_torch.py OUT [options]
"""

import argparse
import os
import signal
import sys
import threading

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "..", "examples"))
from digits_common import load_split, torch_model  # noqa: E402
from recording import write_rank_result  # noqa: E402
from torch.utils.data import Subset, TensorDataset  # noqa: E402

import hvdkit.torch as hk  # noqa: E402

SEEN_DTYPES = set()  # the dtypes of the model's outputs in training and validation: the precision used


def accuracy(out, y):
    SEEN_DTYPES.add(str(out.dtype))
    return (out.argmax(1) == y).float().mean()


def parse(argv):
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--checkpoint-dir", default=None)
    p.add_argument("--checkpoint-every", default="epoch")
    p.add_argument("--global-batch-size", type=int, default=None)
    p.add_argument("--precision", default="fp32")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--val-size", type=int, default=None)
    p.add_argument("--signal-at", type=int, default=None)
    p.add_argument("--kill", action="store_true")
    p.add_argument("--once", default=None)
    p.add_argument("--iterable", action="store_true", help="pass hk.train_loader's loader, not the Dataset")
    p.add_argument("--stop-on-rank1", type=int, default=None, help="a callback on rank 1 stops after this epoch")
    p.add_argument("--tracking", default=None, help="tracking=DIR (TensorBoard)")
    p.add_argument("--progress", action="store_true", help="progress=True (HVDKIT_PROGRESS decides where it shows)")
    p.add_argument("--straggler-threshold", type=float, default=None)
    p.add_argument("--step-logs", action="store_true", help="record what on_train_batch_end is given")
    p.add_argument("--shard", action="store_true", help="shard_optimizer_state=True (ZeRO-1)")
    return p.parse_args(argv)


def signalling(loss_fn, args):
    """``loss_fn`` that, on rank 0, signals this process at its ``--signal-at``-th call (once per marker)."""
    calls = [0]

    def wrapped(out, y):
        calls[0] += torch.is_grad_enabled()  # training micro-batches only (validation runs under no_grad)
        if hk.rank() == 0 and calls[0] == args.signal_at and not (args.once and os.path.exists(args.once)):
            if args.once:
                open(args.once, "w").close()
            if args.kill:  # killed after the checkpoints saved so far are on disk, whatever the write's speed
                for thread in threading.enumerate():
                    if thread.name.startswith("hvdkit-ckpt-write-"):
                        thread.join()
            os.kill(os.getpid(), signal.SIGKILL if args.kill else signal.SIGTERM)
        return loss_fn(out, y)

    return wrapped


class StopOnRank1:
    """Sets ``trainer.stop_training`` on rank 1 only, after epoch ``epoch``; records what it saw."""

    def __init__(self, epoch):
        self.epoch, self.seen = epoch, []

    def on_train_begin(self, trainer):
        self.trainer = trainer

    def on_epoch_end(self, epoch, logs):
        self.seen.append([epoch, sorted(logs)])
        if epoch == self.epoch and hk.rank() == 1:
            self.trainer.stop_training = True

    def on_train_end(self, history):
        self.seen.append(["end", history.epoch])


class StepLogs:
    """Records ``(step, logs)`` of every ``on_train_batch_end``."""

    def __init__(self):
        self.seen = []

    def on_train_batch_end(self, step, logs):
        self.seen.append([step, logs])


def main(argv):
    args = parse(argv)
    topo = hk.init()
    torch.manual_seed(0)  # as the example: seed, then the model
    x_train, y_train, x_val, y_val = load_split(0)
    train = TensorDataset(torch.from_numpy(x_train), torch.from_numpy(y_train), torch.arange(len(y_train)))
    val = TensorDataset(torch.from_numpy(x_val), torch.from_numpy(y_val))
    if args.val_size is not None:
        val = Subset(val, range(args.val_size))
    model = torch_model()
    callback = StopOnRank1(args.stop_on_rank1) if args.stop_on_rank1 is not None else None
    steps = StepLogs() if args.step_logs else None
    every = args.checkpoint_every if args.checkpoint_every == "epoch" else int(args.checkpoint_every)
    trainer = hk.Trainer(
        model,
        torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9),
        signalling(F.cross_entropy, args) if args.signal_at else F.cross_entropy,
        metrics={"accuracy": accuracy},
        batch_size=32,
        global_batch_size=args.global_batch_size,
        eval_batch_size=64,
        checkpoint_dir=args.checkpoint_dir,
        checkpoint_every=every,
        compression="none",
        shard_optimizer_state=args.shard,
        precision=args.precision,
        scheduler=lambda opt: torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=max(1, args.epochs)),
        progress=args.progress,
        tracking=args.tracking,
        straggler_threshold=args.straggler_threshold,
        callbacks=[c for c in (callback, steps) if c],
    )
    data = hk.train_loader(train, 32, seed=0) if args.iterable else train  # the same shards, made by the user
    history = trainer.fit(data, val, epochs=args.epochs)
    result = {
        "size": topo.size,
        "history": history.history,
        "epoch": history.epoch,
        "resumed_from_epoch": history.resumed_from_epoch,
        "step": history.step,
        "stopped": history.stopped,
        "output_dtypes": sorted(SEEN_DTYPES),
        "callback": callback.seen if callback else None,
        "step_logs": steps.seen if steps else None,
        "straggler": trainer.monitor.last_report.as_dict() if trainer.monitor is not None else None,
        "loss_scale": trainer.scaler.get_scale() if trainer.scaler is not None else None,
        "optimizer": type(trainer.optimizer).__name__,
        "state_elements": sum(
            v.numel() for st in trainer.optimizer.state.values() for v in st.values() if isinstance(v, torch.Tensor)
        ),
    }
    if args.val_size is not None:  # the final model over the whole subset, in one process's arithmetic
        xs = torch.stack([val[i][0] for i in range(len(val))])
        ys = torch.stack([val[i][1] for i in range(len(val))])
        with torch.no_grad():
            out = model(xs)
        result["full_val"] = {"val_loss": F.cross_entropy(out, ys).item(), "val_accuracy": accuracy(out, ys).item()}
    write_rank_result(args.out, topo.rank, result)


if __name__ == "__main__":
    main(sys.argv[1:])
