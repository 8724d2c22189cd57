"""Runs on every rank of a real 2-rank job: synchronize() listeners on hk.DistributedOptimizer.

Rank 1 sleeps SLEEP seconds inside every step before its backward pass, so rank 0's
synchronize() waits about that long. Two straggler monitors and one plain listener are attached;
the optimizer instance must carry no ``synchronize`` of its own (no instance patching).
Writes OUT/rank<r>.json. Usage: python synchronize_listener_torch.py OUT
"""

import hashlib
import sys
import time

import torch
from recording import write_rank_result

import hvdkit.torch as hk
from hvdkit.core import ConfigError

STEPS = 4
SLEEP = 0.15
B = 4


def main(out_dir):
    topo = hk.init()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))
    hk.broadcast_state(model)
    opt = hk.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model=model, max_grad_norm=0.5)
    attrs_before = set(vars(opt))
    monitor = hk.StragglerMonitor(threshold=1.5, optimizer=opt)
    second = hk.StragglerMonitor(threshold=1.5, name="second", optimizer=opt)
    seen = []
    opt.add_synchronize_listener(seen.append)
    new_attributes = sorted(set(vars(opt)) - attrs_before)  # what attaching them put on the instance
    g = torch.Generator().manual_seed(topo.rank)
    for step in range(STEPS):
        x, y = torch.randn(B, 8, generator=g), torch.randn(B, 4, generator=g)
        with monitor.step(), second.step():
            opt.zero_grad()
            loss = torch.nn.functional.mse_loss(model(x), y)
            if topo.rank == 1:
                time.sleep(SLEEP)
            loss.backward()
            if step == STEPS - 1:  # the manual path: synchronize, then step without a second one
                opt.synchronize()
                with opt.skip_synchronize():
                    opt.step()
            else:
                opt.step()
    refused = []
    for bad in (
        lambda: hk.StragglerMonitor(name="plain", optimizer=torch.optim.SGD(model.parameters(), lr=0.1)),
        lambda: opt.add_synchronize_listener(42),
    ):
        try:
            bad()
        except ConfigError as e:
            refused.append(str(e))
    timings = [m.local_timing() for m in (monitor, second)]
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    result = {
        "rank": topo.rank,
        "synchronize_in_instance": "synchronize" in vars(opt),
        "new_instance_attributes": new_attributes,
        "class_module": type(opt).__module__,
        "listener_calls": len(seen),
        "listener_seconds": sum(seen),
        "median_step_s": [t.median_s for t in timings],
        "steps_timed": [t.steps for t in timings],
        "digest": hashlib.sha256(flat.double().numpy().tobytes()).hexdigest(),
        "last_grad_norm": float(opt.last_grad_norm),
        "refused": refused,
    }
    write_rank_result(out_dir, topo.rank, result)


if __name__ == "__main__":
    main(sys.argv[1])
