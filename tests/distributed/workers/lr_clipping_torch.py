"""Runs on every rank of a real 2-rank torch job: clipping after averaging, and the scaled LR schedule.

Writes OUT/rank<r>.json. References are 1-process runs computed on each rank without collectives.
Usage: python lr_clipping_torch.py OUT
"""

import copy
import math
import sys

import torch
from lr_clipping_setup import LR, MAX_NORM, B
from model_params import max_param_diff as max_diff
from model_params import params_digest as digest
from recording import run_sections

import hvdkit.torch as hk

STEPS = 5


def make_model(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))


def global_batches(size):
    g = torch.Generator().manual_seed(1234)
    # targets far from the outputs: large gradients, so clipping matters
    return torch.randn(STEPS, size * B, 8, generator=g), 5 * torch.randn(STEPS, size * B, 4, generator=g)


def reference(init, x, y, size, per_rank_clip=False):
    """1 process, batch size*B: clip the gradient of the global batch (or, wrongly, each rank's part first)."""
    model = copy.deepcopy(init)
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)
    norms = []
    for s in range(STEPS):
        parts = [slice(r * B, (r + 1) * B) for r in range(size)] if per_rank_clip else [slice(None)]
        grads = []
        for part in parts:
            opt.zero_grad()
            torch.nn.functional.mse_loss(model(x[s][part]), y[s][part]).backward()
            if per_rank_clip:
                torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_NORM)
            grads.append([p.grad.clone() for p in model.parameters()])
        for i, p in enumerate(model.parameters()):
            p.grad = sum(g[i] for g in grads) / len(grads)
        if not per_rank_clip:
            norms.append(float(torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_NORM)))
        opt.step()
    return model, norms


def train_distributed(init, x, y, rank, manual=False, passes=1):
    model = copy.deepcopy(init)
    base = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)
    opt = hk.DistributedOptimizer(
        base, model=model, max_grad_norm=None if manual else MAX_NORM, backward_passes_per_step=passes
    )
    mine = slice(rank * B, (rank + 1) * B)
    norms = []
    for s in range(STEPS):
        opt.zero_grad()
        for part in torch.chunk(torch.arange(B), passes):
            (torch.nn.functional.mse_loss(model(x[s][mine][part]), y[s][mine][part]) / passes).backward()
        if manual:  # the documented recipe
            opt.synchronize()
            norms.append(float(torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_NORM)))
            with opt.skip_synchronize():
                opt.step()
        else:
            opt.step()
            norms.append(float(opt.last_grad_norm))
    return model, norms


def section_clipping(rank, size):
    x, y = global_batches(size)
    init = make_model(seed=0)
    ref, ref_norms = reference(init, x, y, size)
    out = {"reference_norms": ref_norms, "moved": max_diff(ref, init)}
    for name, kwargs in [("max_grad_norm", {}), ("manual_recipe", {"manual": True}), ("accum2", {"passes": 2})]:
        model, norms = train_distributed(init, x, y, rank, **kwargs)
        out[name] = {"digest": digest(model), "max_diff_vs_reference": max_diff(model, ref), "norms": norms}
    wrong, _ = reference(init, x, y, size, per_rank_clip=True)
    out["per_rank_clip_diff"] = max_diff(wrong, ref)
    return out


def section_lr(rank, size):
    out = {}
    for rule in ("linear", "sqrt"):
        model = make_model(seed=0)
        opt = hk.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=LR), model=model, max_grad_norm=1e6)
        sched = hk.ScaledLRScheduler(opt, rule=rule, warmup_steps=4)
        lrs = []
        for _ in range(7):
            lrs.append(opt.param_groups[0]["lr"])
            opt.zero_grad()
            model(torch.ones(2, 8)).sum().backward()
            opt.step()
            sched.step()
        out[rule] = lrs
    out["expected_scale"] = {"linear": size, "sqrt": math.sqrt(size)}
    return out


def main(out_dir):
    run_sections(hk.init, out_dir, clipping=section_clipping, lr=section_lr)


if __name__ == "__main__":
    main(sys.argv[1])
