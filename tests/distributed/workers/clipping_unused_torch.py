"""Runs on every rank of a real 2-rank torch job: ``max_grad_norm`` with a branch only rank 1 uses.

The model adds a branch to its output only for the last rank's samples, so on rank 0 the branch's
parameters have no gradient after ``backward()`` (``zero_grad`` sets them to None) and Horovod only
gives them one inside ``step()``. The clipping norm must still cover them on every rank.
Writes OUT/rank<r>.json. The reference is one process on the concatenated batch, computed on each
rank without collectives.
Usage: python clipping_unused_torch.py OUT
"""

import copy
import sys

import torch
from model_params import max_param_diff, params_digest
from recording import write_rank_result

import hvdkit.torch as hk

STEPS = 5
B = 4  # per-rank batch
LR = 0.1
MAX_NORM = 0.05  # well below the gradients' norms here, so every step is clipped


class BranchNet(torch.nn.Module):
    """A trunk every sample uses, plus a branch added only when ``use_branch`` (a skipped layer)."""

    def __init__(self):
        super().__init__()
        self.trunk = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))
        self.branch = torch.nn.Linear(8, 4)

    def forward(self, x, use_branch):
        out = self.trunk(x)
        return out + 10 * self.branch(x) if use_branch else out


def make_model():
    torch.manual_seed(0)
    return BranchNet()


def global_batches(size):
    g = torch.Generator().manual_seed(4321)
    return torch.randn(STEPS, size * B, 8, generator=g), 5 * torch.randn(STEPS, size * B, 4, generator=g)


def uses_branch(rank, size):
    return rank == size - 1


def reference(init, x, y, size):
    """One process on the concatenated batch: the mean loss over every rank's part, clipped as a whole."""
    model = copy.deepcopy(init)
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)
    norms = []
    for s in range(STEPS):
        grads = []
        for r in range(size):
            opt.zero_grad()
            part = slice(r * B, (r + 1) * B)
            torch.nn.functional.mse_loss(model(x[s][part], uses_branch(r, size)), y[s][part]).backward()
            grads.append([torch.zeros_like(p) if p.grad is None else p.grad.clone() for p in model.parameters()])
        for i, p in enumerate(model.parameters()):
            p.grad = sum(g[i] for g in grads) / size
        norms.append(float(torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_NORM)))
        opt.step()
    return model, norms


def train_distributed(init, x, y, rank, size):
    model = copy.deepcopy(init)
    opt = hk.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9), model=model, max_grad_norm=MAX_NORM
    )
    mine = slice(rank * B, (rank + 1) * B)
    norms, branch_grad_none = [], []
    for s in range(STEPS):
        opt.zero_grad(set_to_none=True)
        torch.nn.functional.mse_loss(model(x[s][mine], uses_branch(rank, size)), y[s][mine]).backward()
        branch_grad_none.append(model.branch.weight.grad is None)
        opt.step()
        norms.append(float(opt.last_grad_norm))
    patched = sorted(name for name in ("step", "zero_grad", "synchronize") if name in vars(opt))
    return model, norms, branch_grad_none, patched


def main(out_dir):
    topo = hk.init()
    rank, size = topo.rank, topo.size
    x, y = global_batches(size)
    init = make_model()
    ref, ref_norms = reference(init, x, y, size)
    model, norms, branch_grad_none, patched = train_distributed(init, x, y, rank, size)
    result = {
        "rank": rank,
        "size": size,
        "digest": params_digest(model),
        "max_diff_vs_reference": max_param_diff(model, ref),
        "branch_moved": float((model.branch.weight - init.branch.weight).abs().max()),
        "norms": norms,
        "reference_norms": ref_norms,
        "branch_grad_none_before_step": branch_grad_none,
        "methods_set_on_the_instance": patched,
    }
    write_rank_result(out_dir, rank, result)


if __name__ == "__main__":
    main(sys.argv[1])
