"""Train an MLP on scikit-learn's bundled digits data on N ranks with hvdkit.

    hvdkit run -np 2 -- python examples/torch_digits.py
    mpirun -np 2 python examples/torch_digits.py          # the same, under plain mpirun
    horovodrun -np 2 --gloo python examples/torch_digits.py

Shows the whole hvdkit path: sharded data, fp16 gradient compression, sample-weighted validation
metrics, a rank-0 checkpoint every epoch and automatic resume from the newest one. On SIGTERM
(preemption) every rank stops after the same step and rank 0 saves it; the next start continues
from that batch. Nothing is downloaded. Ends with one JSON line on rank 0.
"""

import itertools
import sys
import time

import torch
import torch.nn.functional as F
from digits_common import load_split, log_epoch, parse_args, result_line
from torch.utils.data import TensorDataset

import hvdkit.torch as hk
from hvdkit.core import HvdkitError, MetricTracker, get_logger

log = get_logger("examples.torch_digits")


def datasets(seed):
    x_train, y_train, x_val, y_val = load_split(seed)
    return (
        TensorDataset(torch.from_numpy(x_train), torch.from_numpy(y_train)),
        TensorDataset(torch.from_numpy(x_val), torch.from_numpy(y_val)),
    )


def build_model():
    return torch.nn.Sequential(
        torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10)
    )


def evaluate(model, loader):
    """Validation loss and accuracy over the whole set (every rank calls it)."""
    model.eval()
    tracker = MetricTracker(["val_loss", "val_accuracy"])
    with torch.no_grad():
        for x, y in loader:
            out = model(x)
            tracker.update_sum("val_loss", F.cross_entropy(out, y, reduction="sum").item(), len(y))
            tracker.update_sum("val_accuracy", (out.argmax(1) == y).sum().item(), len(y))
    return hk.average_metrics(tracker)


def train(args):
    topo = hk.init()
    torch.manual_seed(args.seed)
    train_ds, val_ds = datasets(args.seed)
    model = build_model()
    optimizer = hk.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9), model=model, compression=args.compression
    )
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=max(1, args.epochs))
    ckpt = hk.Checkpointer(args.checkpoint_dir, model, optimizer, scheduler, keep=args.keep)
    resumed = ckpt.restore()
    if resumed is None:
        hk.broadcast_state(model, optimizer)
        start_epoch, step, position = 0, 0, {}
    else:  # position: where a preempted epoch stopped (empty after a whole epoch)
        start_epoch, step, position = resumed.epoch, resumed.step, resumed.extra or {}
    guard = hk.PreemptionGuard()
    train_loader = hk.train_loader(train_ds, args.batch_size, seed=args.seed)
    val_loader = hk.eval_loader(val_ds, batch_size=256)

    for epoch in range(start_epoch, args.epochs):
        t0 = time.perf_counter()
        model.train()
        train_loader.sampler.set_epoch(epoch)
        tracker = MetricTracker(["loss"])
        done = position.get("batches_done", 0)
        for name, (total, count) in position.get("train_totals", {}).items():
            tracker.update_sum(name, total, count)
        position = {}
        batches = itertools.islice(train_loader, done, None)  # skip what a preempted run did
        for x, y in hk.progress(batches, desc=f"epoch {epoch + 1}/{args.epochs}", total=len(train_loader) - done):
            optimizer.zero_grad()
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            optimizer.step()
            step += 1
            done += 1
            tracker.update("loss", loss.item(), len(y))
            if guard.should_stop():  # every rank agrees to stop after this same step
                ckpt.save(step, epoch, extra={"batches_done": done, "train_totals": tracker.local()})
                if topo.is_rank0:
                    log.info("stopped by a signal at epoch %d, batch %d (step %d): checkpoint saved", epoch + 1, done, step)
                    print(result_line(topo.size, args, start_epoch, step, None, None, preempted=True), flush=True)
                return
        scheduler.step()
        metrics = {**hk.average_metrics(tracker), **evaluate(model, val_loader)}
        ckpt.save(step, epoch + 1)
        if topo.is_rank0:
            log_epoch(log, epoch, args.epochs, metrics, time.perf_counter() - t0)

    final = evaluate(model, val_loader)
    if topo.is_rank0:
        print(result_line(topo.size, args, start_epoch, step, final["val_accuracy"], final["val_loss"]), flush=True)


def main(argv=None):
    args = parse_args(__doc__.splitlines()[0], "checkpoints/torch_digits", argv)
    try:
        train(args)
    except HvdkitError as e:
        print(f"torch_digits: error: {e}", file=sys.stderr, flush=True)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
