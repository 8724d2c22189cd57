"""The digits training of examples/torch_digits.py with the loop written out by hand.

    hvdkit run -np 2 -- python examples/torch_digits_loop.py
    mpirun -np 2 python examples/torch_digits_loop.py          # the same, under plain mpirun
    horovodrun -np 2 --gloo python examples/torch_digits_loop.py

For people who want their own loop: every call ``hk.Trainer`` makes for you (torch_digits.py), in
the order it makes them, with the same results bitwise. Sharded data, fp16 gradient compression,
sample-weighted validation metrics, a rank-0 checkpoint every epoch and automatic resume from the
newest one. On SIGTERM (preemption) or at ``--stop-at-step`` every rank stops after the same step
and rank 0 saves it with the epoch's global sample offset; the next start continues from there, at
any world size (``--global-batch-size`` keeps the maths: the accumulation per rank adapts).
Nothing is downloaded. Ends with one JSON line on rank 0.
"""

import sys
import time

import torch
import torch.nn.functional as F
from digits_common import SampleLog, log_epoch, result_line, run, torch_datasets, torch_model

import hvdkit.torch as hk
from hvdkit.core import MetricTracker, get_logger

log = get_logger("examples.torch_digits_loop")


def evaluate(model, loader):
    """Validation loss and accuracy over the whole set (every rank calls it)."""
    model.eval()
    tracker = MetricTracker(["val_loss", "val_accuracy"])
    with torch.no_grad():
        for x, y in loader:
            x, y = x.to(hk.device()), y.to(hk.device())
            out = model(x)
            tracker.update_sum("val_loss", F.cross_entropy(out, y, reduction="sum").item(), len(y))
            tracker.update_sum("val_accuracy", (out.argmax(1) == y).sum().item(), len(y))
    return hk.average_metrics(tracker)


def train(args):
    topo = hk.init()
    torch.manual_seed(args.seed)
    train_ds, val_ds = torch_datasets(args.seed)
    model = torch_model().to(hk.device())  # this rank's GPU where there are GPUs, else the CPU
    # The global batch (if given) stays the same at any world size: the loader picks the accumulation.
    train_loader = hk.train_loader(train_ds, args.batch_size, seed=args.seed, global_batch_size=args.global_batch_size)
    accumulation = train_loader.accumulation
    optimizer = hk.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9),
        model=model,
        compression=args.compression,
        backward_passes_per_step=accumulation,
    )
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=max(1, args.epochs))
    ckpt = hk.Checkpointer(args.checkpoint_dir, model, optimizer, scheduler, keep=args.keep, seed=args.seed)
    resumed = ckpt.restore()
    if resumed is None:
        hk.broadcast_state(model, optimizer)
        start_epoch, step, position = 0, 0, {}
    else:  # position: where a stopped epoch stopped, as a global sample offset (empty after a whole epoch)
        start_epoch, step, position = resumed.epoch, resumed.step, resumed.extra or {}
    guard = hk.PreemptionGuard()
    val_loader = hk.eval_loader(val_ds, batch_size=256)
    samples = SampleLog(args.sample_log, topo.rank, topo.size)

    for epoch in range(start_epoch, args.epochs):
        t0 = time.perf_counter()
        model.train()
        train_loader.sampler.set_epoch(epoch, start=position.get("samples_done", 0))
        tracker = MetricTracker(["loss"])
        if topo.is_rank0:  # the job-wide totals of the stopped part of the epoch, counted once
            for name, (total, count) in position.get("train_totals", {}).items():
                tracker.update_sum(name, total, count)
        position = {}
        steps_done, indices = 0, []
        batches = hk.progress(train_loader, desc=f"epoch {epoch + 1}/{args.epochs}", total=len(train_loader))
        for micro, (x, y, idx) in enumerate(batches, 1):
            x, y = x.to(hk.device()), y.to(hk.device())
            loss = F.cross_entropy(model(x), y)
            (loss / accumulation).backward()  # the mean over the step's micro-batches
            tracker.update("loss", loss.item(), len(y))
            indices += idx.tolist()
            if micro % accumulation:
                continue
            optimizer.step()
            optimizer.zero_grad()
            step += 1
            steps_done += 1
            samples.write(epoch, step, indices)
            indices = []
            if guard.should_stop(step=step) or step == args.stop_at_step:  # every rank stops after this same step
                totals = job_totals(tracker)
                ckpt.save(
                    step, epoch, extra={"samples_done": train_loader.position(steps_done), "train_totals": totals}
                )
                if topo.is_rank0:
                    offset = train_loader.position(steps_done)
                    log.info(
                        "stopped at epoch %d after %d samples (step %d): checkpoint saved", epoch + 1, offset, step
                    )
                    print(
                        result_line(
                            topo.size,
                            args,
                            start_epoch,
                            step,
                            None,
                            None,
                            preempted=True,
                            compression=optimizer.compression,
                        ),
                        flush=True,
                    )
                return
        scheduler.step()
        metrics = {**hk.average_metrics(tracker), **evaluate(model, val_loader)}
        ckpt.save(step, epoch + 1)
        if topo.is_rank0:
            log_epoch(log, epoch, args.epochs, metrics, time.perf_counter() - t0)

    final = evaluate(model, val_loader)
    if topo.is_rank0:
        print(
            result_line(
                topo.size,
                args,
                start_epoch,
                step,
                final["val_accuracy"],
                final["val_loss"],
                compression=optimizer.compression,
            ),
            flush=True,
        )


def job_totals(tracker):
    """``{metric: [sum, count]}`` over all ranks (collective), to carry into a resumed epoch at any world size."""
    local = tracker.local()
    names = sorted(local)
    flat = hk.communicator().allreduce_sum([v for n in names for v in local[n]], name="hvdkit.examples.totals")
    return {n: [float(flat[2 * i]), int(flat[2 * i + 1])] for i, n in enumerate(names)}


def main(argv=None):
    return run(train, __doc__, "torch_digits_loop", argv)


if __name__ == "__main__":
    sys.exit(main())
