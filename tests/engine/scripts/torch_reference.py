"""What the torch engine scripts share: the small model, its data, and one process trained on the
concatenated batches of every rank (the reference a data-parallel job must match). No collectives."""

import copy
import hashlib

import torch
import torch.nn.functional as F


def make_model(seed):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))


def flat(model):
    return torch.cat([p.detach().reshape(-1) for p in model.state_dict().values()])


def digest(model):
    return hashlib.sha256(flat(model).double().numpy().tobytes()).hexdigest()


def max_diff(a, b):
    return float((flat(a).double() - flat(b).double()).abs().max())


def batches(steps, size, per_rank):
    """``steps`` global batches of ``size * per_rank`` samples (inputs, targets), the same on every rank."""
    g = torch.Generator().manual_seed(99)
    return torch.randn(steps, size * per_rank, 6, generator=g), torch.randn(steps, size * per_rank, 3, generator=g)


def make_base(name, model, lr_scale=1.0):
    if name == "sgd":
        return torch.optim.SGD(model.parameters(), lr=0.1 * lr_scale, momentum=0.9)
    return torch.optim.AdamW(model.parameters(), lr=0.05 * lr_scale, weight_decay=0.5)


def reference_step(model, opt, x, y, size, per_rank, reduce="mean"):
    """One optimizer step with every rank's part's gradient (of ``x``, ``y``) averaged, or summed."""
    grads = []
    for r in range(size):
        opt.zero_grad()
        part = slice(r * per_rank, (r + 1) * per_rank)
        F.mse_loss(model(x[part]), y[part]).backward()
        grads.append([p.grad.clone() for p in model.parameters()])
    for i, p in enumerate(model.parameters()):
        total = sum(g[i] for g in grads)
        p.grad = total if reduce == "sum" else total / size
    opt.step()


def reference(init, opt_name, steps, size, per_rank, reduce="mean"):
    """A copy of ``init`` trained by one process on the concatenated batches of ``batches()``."""
    model = copy.deepcopy(init)
    opt = make_base(opt_name, model)
    x, y = batches(steps, size, per_rank)
    for s in range(steps):
        reference_step(model, opt, x[s], y[s], size, per_rank, reduce)
    return model
