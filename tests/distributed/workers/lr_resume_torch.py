"""Runs on every rank of a real torch job: one leg of a run whose world size changes between legs.

Restores the newest checkpoint in CKPT (if any), takes STEPS optimizer steps with a linear-rule
``ScaledLRScheduler`` (warmup over 4 steps), saves, and writes the rate each step used to
OUT/rank<r>.json as [[step, lr], ...].
Usage: python lr_resume_torch.py OUT CKPT STEPS
"""

import sys

import torch
from lr_clipping_setup import LR
from recording import write_sections

import hvdkit.torch as hk

WARMUP_STEPS = 4


def main(out, ckpt_dir, steps):
    topo = hk.init()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 4))
    opt = hk.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=LR), model=model)
    sched = hk.ScaledLRScheduler(opt, "linear", warmup_steps=WARMUP_STEPS)
    ckpt = hk.Checkpointer(ckpt_dir, model, opt, sched)
    resumed = ckpt.restore()
    start = resumed.step if resumed else 0
    used = []
    for t in range(start, start + steps):
        used.append([t, opt.param_groups[0]["lr"]])
        opt.zero_grad()
        model(torch.full((2, 8), topo.rank + 1.0)).sum().backward()
        opt.step()
        sched.step()
    ckpt.save(step=start + steps, epoch=0)
    write_sections(out, topo, used=used)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
