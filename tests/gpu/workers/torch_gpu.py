"""Runs on every rank of a real 2-rank job on CUDA; writes what it observed to OUT/rank<r>.json.

tests/gpu/test_torch_gpu.py asserts on those files. Every section trains or exchanges CUDA tensors
(NCCL in a GPU engine) and compares with a 1-process reference computed here, on the same GPU.
Usage: python torch_gpu.py OUT
"""

import copy
import hashlib
import json
import os
import sys
import time
import traceback

import torch

import hvdkit.torch as hk
from hvdkit.core import MetricTracker

STEPS = 5
B = 8  # per-rank batch
LR = 0.1


def digest(model):
    flat = torch.cat([p.detach().reshape(-1).double().cpu() for p in model.parameters()])
    return hashlib.sha256(flat.numpy().tobytes()).hexdigest()


def max_diff(a, b):
    return max(
        (p.detach().double().cpu() - q.detach().double().cpu()).abs().max().item()
        for p, q in zip(a.parameters(), b.parameters())
    )


def make_model(seed):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.Tanh(), torch.nn.Linear(64, 8))


def global_batches(size, steps=STEPS, device="cuda"):
    g = torch.Generator().manual_seed(1234)
    x = torch.randn(steps, size * B, 32, generator=g)
    y = torch.randn(steps, size * B, 8, generator=g)
    return x.to(device), y.to(device)


def train(model, x, y, rank=None, compression="none", amp=False, steps=STEPS, clip=None, bf16=False, **opt_kwargs):
    """``rank`` None: one process on the whole global batch; else hvdkit on this rank's half.

    ``clip``: the reference clips its whole-batch gradient to this norm; hvdkit ranks get
    ``max_grad_norm=clip`` (clipping after averaging). ``bf16``: forward passes under ``hk.autocast()``.
    """
    base = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)
    if rank is not None and clip is not None:
        opt_kwargs["max_grad_norm"] = clip
    opt = base if rank is None else hk.DistributedOptimizer(base, model=model, compression=compression, **opt_kwargs)
    scaler = torch.amp.GradScaler("cuda", init_scale=2.0**12) if amp else None
    rows = slice(None) if rank is None else slice(rank * B, (rank + 1) * B)
    losses = []
    for s in range(steps):
        opt.zero_grad()
        context = hk.autocast(dtype="bfloat16") if bf16 else torch.autocast("cuda", dtype=torch.float16, enabled=amp)
        with context:
            loss = torch.nn.functional.mse_loss(model(x[s][rows]), y[s][rows])
        losses.append(loss.item())
        if amp:
            scaler.scale(loss).backward()
            if rank is None:
                scaler.step(opt)
                scaler.update()
            else:
                hk.amp_step(opt, scaler)
        else:
            loss.backward()
            if rank is None and clip is not None:
                torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
            opt.step()
    return {"losses": losses, "scale": scaler.get_scale() if amp else None, "opt": opt}


def section_device(rank, size):
    dev = hk.device()
    return {"device": str(dev), "current": torch.cuda.current_device(), "name": torch.cuda.get_device_name(dev)}


def section_contracts(rank, size):
    x, y = global_batches(size)
    init = make_model(seed=rank).cuda()  # different on purpose: broadcast_state must fix it
    hk.broadcast_state(init)
    out = {"init_digest": digest(init), "init_device": str(next(init.parameters()).device)}
    ref = copy.deepcopy(init)
    train(ref, x, y)
    for name, kwargs in {"fp32": {}, "fp16": {"compression": "fp16"}}.items():
        model = copy.deepcopy(init)
        train(model, x, y, rank=rank, **kwargs)
        out[name] = {"digest": digest(model), "ref_diff": max_diff(model, ref)}
    return out


def section_amp(rank, size):
    steps = 20
    x, y = global_batches(size, 1)  # one global batch, every step: a loss that must fall
    x, y = x.repeat(steps, 1, 1), y.repeat(steps, 1, 1)
    init = make_model(seed=7).cuda()
    ref = copy.deepcopy(init)
    r = train(ref, x, y, amp=True, steps=steps)
    model = copy.deepcopy(init)
    d = train(model, x, y, rank=rank, amp=True, steps=steps)
    return {
        "digest": digest(model),
        "ref_diff": max_diff(model, ref),
        "scale": d["scale"],
        "ref_scale": r["scale"],
        "first_loss": r["losses"][0],
        "last_loss": r["losses"][-1],
    }


def section_checkpoint(rank, size, folder):
    x, y = global_batches(size)
    gpu = make_model(seed=3).cuda()
    hk.broadcast_state(gpu)
    r = train(gpu, x, y, rank=rank)
    on_gpu = hk.Checkpointer(os.path.join(folder, "from-gpu"), gpu, r["opt"])
    on_gpu.save(step=STEPS, epoch=0)
    cpu = make_model(seed=11)  # CPU model, other values
    cpu_opt = torch.optim.SGD(cpu.parameters(), lr=LR, momentum=0.9)
    resumed = hk.Checkpointer(os.path.join(folder, "from-gpu"), cpu, cpu_opt).restore()
    out = {
        "gpu_to_cpu": {
            "step": resumed.step if resumed else None,
            "diff": max_diff(cpu, gpu),
            "param_device": str(next(cpu.parameters()).device),
            "state_devices": sorted({str(s["momentum_buffer"].device) for s in cpu_opt.state.values()}),
        }
    }
    hk.Checkpointer(os.path.join(folder, "from-cpu"), cpu, cpu_opt).save(step=STEPS + 1, epoch=0)
    back = make_model(seed=12).cuda()
    back_opt = torch.optim.SGD(back.parameters(), lr=LR, momentum=0.9)
    resumed = hk.Checkpointer(os.path.join(folder, "from-cpu"), back, back_opt).restore()
    out["cpu_to_gpu"] = {
        "step": resumed.step if resumed else None,
        "diff": max_diff(back, gpu),
        "param_device": str(next(back.parameters()).device),
        "state_devices": sorted({str(s["momentum_buffer"].device) for s in back_opt.state.values()}),
    }
    return out


def section_more(rank, size):
    """Clipping after averaging, ZeRO-1 state sharding, bf16 autocast and ``compression="auto"`` on CUDA.

    Each part is recorded on its own (an error in one leaves the others measured).
    """
    x, y = global_batches(size)
    init = make_model(seed=5).cuda()
    hk.broadcast_state(init)
    out = {}

    def part(name, fn):
        try:
            out[name] = fn()
        except Exception:  # noqa: BLE001 - recorded for the test to show
            out[name] = {"error": traceback.format_exc()}

    def versus_reference(ref_kwargs, rank_kwargs):
        ref, model = copy.deepcopy(init), copy.deepcopy(init)
        train(ref, x, y, **ref_kwargs)
        r = train(model, x, y, rank=rank, **rank_kwargs)
        return model, ref, r

    def clipped():
        clip = 0.05  # well below the gradients' norm here, so every step is clipped
        model, ref, r = versus_reference({"clip": clip}, {"clip": clip})
        return {"digest": digest(model), "ref_diff": max_diff(model, ref), "norm": float(r["opt"].last_grad_norm)}

    def zero():
        model, ref, r = versus_reference({}, {"shard_optimizer_state": True})
        return {
            "digest": digest(model),
            "ref_diff": max_diff(model, ref),
            "device": str(next(model.parameters()).device),
        }

    def bf16():
        model, ref, _ = versus_reference({"bf16": True}, {"bf16": True})
        return {"digest": digest(model), "ref_diff": max_diff(model, ref)}

    def auto():
        model, _, r = versus_reference({}, {"compression": "auto"})
        return {"digest": digest(model), "chosen": str(r["opt"].compression)}

    def straggler():
        model = copy.deepcopy(init)
        opt = hk.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=LR), model=model)
        monitor = hk.StragglerMonitor(threshold=1.2, optimizer=opt, name="gpu")
        rows = slice(rank * B, (rank + 1) * B)
        for s in range(STEPS):
            with monitor.step():
                opt.zero_grad()
                torch.nn.functional.mse_loss(model(x[s][rows]), y[s][rows]).backward()
                if rank == 1:
                    time.sleep(0.2)  # the slow rank: rank 0's wait for it is left out of rank 0's time
                opt.step()
                torch.cuda.synchronize()
        return {"straggler": monitor.epoch_end(0).straggler}

    parts = {"clip": clipped, "zero": zero, "bf16": bf16, "auto": auto, "straggler": straggler}
    for name, fn in parts.items():
        part(name, fn)
    return out


def section_metrics(rank, size):
    tracker = MetricTracker(["loss"])
    values = torch.arange(3 + rank, dtype=torch.float32, device="cuda") + 10 * rank  # rank 0: 0,1,2; rank 1: 10..13
    tracker.update("loss", values.mean(), count=values.numel())
    return {"mean": hk.average_metrics(tracker)["loss"]}


def main():
    out = sys.argv[1]
    topo = hk.init()
    rank, size = topo.rank, topo.size
    import horovod.torch as hvd

    result = {"rank": rank, "size": size, "nccl_built": bool(hvd.nccl_built())}
    folder = os.path.join(out, "ckpt")
    sections = [
        ("device", section_device),
        ("contracts", section_contracts),
        ("amp", section_amp),
        ("checkpoint", lambda r, s: section_checkpoint(r, s, folder)),
        ("metrics", section_metrics),
        ("more", section_more),  # last: newer contracts, each part recorded on its own
    ]
    for name, fn in sections:
        try:
            result[name] = fn(rank, size)
        except Exception:  # noqa: BLE001 - recorded for the test to show, then the job fails
            result[name] = {"error": traceback.format_exc()}
            break
    with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
