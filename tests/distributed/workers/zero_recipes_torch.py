"""Fine-tuning and clipping recipes on a real 2-rank torch job, sharded (ZeRO-1) and unsharded.

Imported by workers/zero_torch.py (its ``train`` mode). A backbone (7 -> 5) and a head (5 -> 3):

- ``unfrozen_later``: the backbone frozen when the optimizer is built and unfrozen after 2 steps (progressive
  unfreezing). Unsharded, it must train on as plain torch on the global batch does. Sharded, the next
  step must raise ConfigError on every rank naming ``backbone.weight`` and the fix; the optimizer rebuilt
  after unfreezing (the stale one kept alive, as a scheduler would keep it) then trains as plain torch.
- ``added_group``: a sharded Adam over the head, then ``add_param_group`` with the unfrozen backbone
  (torch's fine-tuning recipe): it must train as plain torch's Adam on the global batch.
- ``synchronize_recipe``: Horovod's clipping recipe (``opt.synchronize()``, ``opt.skip_synchronize()``)
  on a sharded optimizer must be a ConfigError naming ``max_grad_norm``, not an AttributeError.
"""

import torch
from model_params import params_digest, params_of

import hvdkit.torch as hk

GLOBAL = 6


class Tuned(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(3)
        self.backbone = torch.nn.Linear(7, 5)
        self.head = torch.nn.Linear(5, 3)

    def forward(self, x):
        return self.head(torch.tanh(self.backbone(x)))


def batch(step, rank=None, size=None):
    """Step ``step``'s global batch, or this rank's share of it."""
    g = torch.Generator().manual_seed(500 + step)
    x, y = torch.randn(GLOBAL, 7, generator=g), torch.randn(GLOBAL, 3, generator=g)
    if rank is None:
        return x, y
    per = GLOBAL // size
    return x[rank * per : (rank + 1) * per], y[rank * per : (rank + 1) * per]


def one_step(model, opt, x, y):
    opt.zero_grad()
    torch.nn.functional.mse_loss(model(x), y).backward()
    opt.step()


def rel_diff(a, b):
    pa, pb = params_of(a).double(), params_of(b).double()
    return float(((pa - pb).abs() / pb.abs().clamp(min=1e-3)).max())


def failure(call):
    """``"Type: message"`` of what ``call()`` raises, or None."""
    try:
        call()
    except Exception as e:  # noqa: BLE001 - the type is part of what the test checks
        return f"{type(e).__name__}: {e}"
    return None


def unfrozen_later(rank, size, shard):
    def build(model):
        sgd = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        return hk.DistributedOptimizer(sgd, model=model, shard_optimizer_state=shard)

    model, ref = Tuned(), Tuned()
    for m in (model, ref):
        m.backbone.requires_grad_(False)
    opt, ref_opt = build(model), torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)
    for s in range(2):
        one_step(model, opt, *batch(s, rank, size))
        one_step(ref, ref_opt, *batch(s))
    for m in (model, ref):
        m.backbone.requires_grad_(True)
    before = model.backbone.weight.detach().clone()
    error = failure(lambda: one_step(model, opt, *batch(2, rank, size)))
    unfrozen_moved = float((model.backbone.weight.detach() - before).abs().max())
    if error is None:
        one_step(ref, ref_opt, *batch(2))
    else:  # the fix the error names: rebuild after unfreezing (the stale optimizer kept alive, as a scheduler would)
        stale = opt  # noqa: F841 - its hooks must leave the new optimizer alone
        opt, ref_opt = build(model), torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)
    for s in range(3, 6):
        one_step(model, opt, *batch(s, rank, size))
        one_step(ref, ref_opt, *batch(s))
    return {
        "error": error,
        "unfrozen_moved": unfrozen_moved,
        "digest": params_digest(model),
        "rel_diff": rel_diff(model, ref),
        "moved": float((model.backbone.weight.detach() - before).abs().max()),
    }


def added_group(rank, size):
    model, ref = Tuned(), Tuned()
    for m in (model, ref):
        m.backbone.requires_grad_(False)
    opt = hk.DistributedOptimizer(
        torch.optim.Adam(model.head.parameters(), lr=1e-2), model=model, shard_optimizer_state=True
    )
    ref_opt = torch.optim.Adam(ref.head.parameters(), lr=1e-2)
    for s in range(2):
        one_step(model, opt, *batch(s, rank, size))
        one_step(ref, ref_opt, *batch(s))
    before = model.backbone.weight.detach().clone()

    def unfreeze_and_train():
        for m, o in ((model, opt), (ref, ref_opt)):
            m.backbone.requires_grad_(True)
            o.add_param_group({"params": list(m.backbone.parameters()), "lr": 3e-3})
        for s in range(2, 6):
            one_step(model, opt, *batch(s, rank, size))
            one_step(ref, ref_opt, *batch(s))

    error = failure(unfreeze_and_train)
    out = {
        "error": error,
        "digest": params_digest(model),
        "rel_diff": rel_diff(model, ref),
        "moved": float((model.backbone.weight.detach() - before).abs().max()),
    }
    if error is None:
        opt.consolidate_state_dict(to=None)
        full, want = opt.state_dict(), ref_opt.state_dict()
        out["same_structure"] = full["param_groups"] == want["param_groups"] and sorted(full["state"]) == sorted(
            want["state"]
        )
        out["state_max_diff"] = max(
            float((full["state"][i][k].double() - v.double()).abs().max())
            for i, entry in want["state"].items()
            for k, v in entry.items()
        )
    return out


def synchronize_recipe(rank, size):
    model = Tuned()
    opt = hk.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model=model, shard_optimizer_state=True)
    opt.zero_grad()
    x, y = batch(0, rank, size)
    torch.nn.functional.mse_loss(model(x), y).backward()
    errors = {name: failure(lambda name=name: getattr(opt, name)()) for name in ("synchronize", "skip_synchronize")}
    opt.step()  # the job goes on
    return {**errors, "digest": params_digest(model)}


def run(rank, size):
    """Every recipe, on every rank in the same order."""
    return {
        "unfrozen_sharded": unfrozen_later(rank, size, shard=True),
        "unfrozen_unsharded": unfrozen_later(rank, size, shard=False),
        "added_group": added_group(rank, size),
        "synchronize": synchronize_recipe(rank, size),
    }
