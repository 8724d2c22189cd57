"""Runs on every rank of a real 2-rank job; writes what it observed to OUT/rank<r>.json.

The pytest side (tests/distributed/test_torch_contracts.py) asserts on those files. Each section uses
deterministic inputs with answers known in closed form or computed by a 1-process reference.
Usage: python torch_contracts.py OUT
"""

import copy
import hashlib
import os
import sys

import torch
from model_params import max_param_diff as max_diff
from model_params import params_of
from recording import error_of, write_sections

import hvdkit.torch as hk
from hvdkit.core import CheckpointError, CollectiveError, ConfigError, MetricTracker

STEPS = 5
B = 4  # per-rank batch
LR = 0.1


def digest(tensor):
    return hashlib.sha256(tensor.double().numpy().tobytes()).hexdigest()


def make_model(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))


def global_batches(size):
    g = torch.Generator().manual_seed(1234)
    x = torch.randn(STEPS, size * B, 8, generator=g)
    y = torch.randn(STEPS, size * B, 4, generator=g)
    return x, y


def train_reference(model, x, y, scale=1.0, rows=None):
    """1 process, plain SGD on the global batch (``rows`` selects part of it; ``scale`` the grad)."""
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)
    for s in range(STEPS):
        xs, ys = (x[s], y[s]) if rows is None else (x[s][rows], y[s][rows])
        opt.zero_grad()
        (scale * torch.nn.functional.mse_loss(model(xs), ys)).backward()
        opt.step()
    return model


def train_distributed(model, x, y, rank, compression="none", passes=1, amp=False):
    base = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)
    opt = hk.DistributedOptimizer(base, model=model, compression=compression, backward_passes_per_step=passes)
    mine = slice(rank * B, (rank + 1) * B)  # rank-dependent data
    for s in range(STEPS):
        xs, ys = x[s][mine], y[s][mine]
        opt.zero_grad()
        for part in torch.chunk(torch.arange(B), passes):
            with hk.autocast(enabled=amp):
                loss = torch.nn.functional.mse_loss(model(xs[part]), ys[part])
            (loss / passes).backward()
        opt.step()
    return model


def section_training(rank, size):
    x, y = global_batches(size)
    init = make_model(seed=rank)  # different on purpose: broadcast_state must fix it
    hk.broadcast_state(init)
    out = {"init_digest": digest(params_of(init))}
    ref = train_reference(copy.deepcopy(init), x, y)
    for name, kwargs in {
        "fp32": {},
        "fp16": {"compression": "fp16"},
        "accum2": {"passes": 2},
        "bf16_autocast": {"amp": True},
    }.items():
        model = train_distributed(copy.deepcopy(init), x, y, rank, **kwargs)
        out[name] = {"digest": digest(params_of(model)), "max_diff_vs_reference": max_diff(model, ref)}
    # What a wrong reduction would give: summing instead of averaging, or losing rank 1's half.
    out["wrong_sum_diff"] = max_diff(train_reference(copy.deepcopy(init), x, y, scale=size), ref)
    out["wrong_missing_rank_diff"] = max_diff(train_reference(copy.deepcopy(init), x, y, rows=slice(0, B)), ref)
    out["moved"] = max_diff(ref, init)
    return out


def section_metrics(rank, size):
    # 10 samples, uneven shards: rank 0 holds 7, rank 1 holds 3. Sample i has loss i^2, correct if i even.
    mine = range(0, 7) if rank == 0 else range(7, 10)
    t = MetricTracker(["loss", "accuracy"])
    for i in mine:
        t.update("loss", float(i * i))
        t.update("accuracy", 1.0 if i % 2 == 0 else 0.0)
    out = {"averaged": hk.average_metrics(t), "local": t.local()}
    bad = MetricTracker(["acc" if rank == 1 else "accuracy"])
    bad.update("acc" if rank == 1 else "accuracy", 1.0)
    out["mismatch_error"] = error_of(lambda: hk.average_metrics(bad), CollectiveError)
    return out


def section_broadcast_extra(rank):
    extra = {"epoch": 7, "note": "from rank 0"} if rank == 0 else None if rank == 1 else [rank]
    got = hk.broadcast_state(extra=extra)
    got2 = hk.broadcast_state(extra=3.5 if rank == 0 else "a string")  # different types again
    return {"extra": got, "extra2": got2}


def section_checkpoint(rank, size, out_dir):
    # Each rank is given its own directory: rank 1's must stay absent, proving only rank 0 writes,
    # and rank 1 must still restore rank 0's state (it is broadcast, not read from disk).
    ckpt_dir = os.path.join(out_dir, f"ckpt-of-rank{rank}")
    x, y = global_batches(size)
    model = make_model(seed=0)
    opt = hk.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9), model=model)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    hk.broadcast_state(model, opt)
    ckpt = hk.Checkpointer(ckpt_dir, model, opt, sched, keep=2)
    mine = slice(rank * B, (rank + 1) * B)
    for s in range(3):
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x[s][mine]), y[s][mine]).backward()
        opt.step()
        sched.step()
    ckpt.save(step=3, epoch=1, extra={"seen": 3})
    saved = {
        "params": digest(params_of(model)),
        "momentum": digest(torch.cat([opt.state[p]["momentum_buffer"].reshape(-1) for p in model.parameters()])),
        "lr": opt.param_groups[0]["lr"],
        "next_rand": torch.rand(3).tolist(),  # drawn right after the save
    }
    # A new process would start from a different random model and an empty optimizer.
    model2 = make_model(seed=100 + rank)
    opt2 = hk.DistributedOptimizer(torch.optim.SGD(model2.parameters(), lr=LR, momentum=0.9), model=model2)
    sched2 = torch.optim.lr_scheduler.StepLR(opt2, step_size=1, gamma=0.5)
    torch.manual_seed(999)
    resumed = hk.Checkpointer(ckpt_dir, model2, opt2, sched2).restore()
    restored = {
        "params": digest(params_of(model2)),
        "momentum": digest(torch.cat([opt2.state[p]["momentum_buffer"].reshape(-1) for p in model2.parameters()])),
        "lr": opt2.param_groups[0]["lr"],
        "next_rand": torch.rand(3).tolist(),
        "step": resumed.step,
        "epoch": resumed.epoch,
        "extra": resumed.extra,
    }
    # A checkpoint of a different model: clear error on every rank, checkpoint untouched.
    other = torch.nn.Linear(3, 3)
    wrong_model_error = error_of(lambda: hk.Checkpointer(ckpt_dir, other).restore(), CheckpointError)
    listing = sorted(os.listdir(ckpt_dir)) if os.path.exists(ckpt_dir) else None
    return {"saved": saved, "restored": restored, "listing": listing, "wrong_model_error": wrong_model_error}


def section_bad_input(out_dir):
    blocker = os.path.join(out_dir, "a-file")
    if hk.rank() == 0:
        with open(blocker, "w") as f:
            f.write("x")
    hk.communicator().barrier()
    sgd = torch.optim.SGD(torch.nn.Linear(2, 2).parameters(), lr=0.1)
    return {
        "unwritable": error_of(
            lambda: hk.Checkpointer(os.path.join(blocker, "ckpt"), torch.nn.Linear(2, 2)), CheckpointError
        ),
        "compression": error_of(lambda: hk.DistributedOptimizer(sgd, compression="int8"), ConfigError),
        "not_optimizer": error_of(lambda: hk.DistributedOptimizer("sgd"), ConfigError),
    }


def section_zero_grad(rank):
    """torch 2's zero_grad(set_to_none=...) on the wrapped optimizer, and Horovod's race check kept."""
    model = torch.nn.Linear(2, 1)
    opt = hk.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model=model)
    out = {}
    for set_to_none in (False, True):
        model(torch.ones(1, 2) * (rank + 1)).sum().backward()
        opt.step()
        opt.zero_grad(set_to_none=set_to_none)
        out[f"set_to_none_{set_to_none}"] = [
            None if p.grad is None else p.grad.abs().sum().item() for p in model.parameters()
        ]
    model(torch.ones(1, 2)).sum().backward()  # averaging in flight: zeroing now is Horovod's error
    out["before_step"] = error_of(lambda: opt.zero_grad(set_to_none=True), AssertionError)
    opt.step()
    return out


def main(out_dir):
    topo = hk.init()
    rank, size = topo.rank, topo.size
    write_sections(
        out_dir,
        topo,
        training=section_training(rank, size),
        metrics=section_metrics(rank, size),
        broadcast=section_broadcast_extra(rank),
        checkpoint=section_checkpoint(rank, size, out_dir),
        bad_input=section_bad_input(out_dir),
        zero_grad=section_zero_grad(rank),
    )


if __name__ == "__main__":
    main(sys.argv[1])
