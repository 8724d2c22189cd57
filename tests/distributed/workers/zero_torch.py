"""Runs on every rank of a real torch job: ``shard_optimizer_state=True`` (ZeRO-1) against the unsharded optimizer.

``train`` (2 ranks): for SGD+momentum, Adam and AdamW with weight decay (and Adam with accumulation
and clipping) the same model is trained sharded and unsharded on the same batches; each rank records
its parameters' digest, the largest relative difference to the unsharded run, and the elements its
optimizer state holds. The sharded state dict is compared with the unsharded one. LBFGS must be
refused. A sharded AdamW run saves a checkpoint at step ``SAVE`` and goes on to ``STEPS``.
A fresh sharded AdamW then restores it and trains to ``STEPS`` again (2 -> 2 ranks).
``resume`` (1 rank): an unsharded AdamW restores that checkpoint and trains the remaining steps on
the whole global batch, saving again at ``REGROW``. ``regrow`` (2 ranks): a sharded AdamW restores
that 1-rank checkpoint and trains to ``STEPS``. ``train`` also runs the fine-tuning and clipping
recipes of workers/zero_recipes_torch.py. Writes OUT/<mode>-rank<r>.json.
Usage: python zero_torch.py OUT {train,resume,regrow}
"""

import json
import os
import sys

import torch
import zero_recipes_torch
from model_params import params_digest, params_of

import hvdkit.torch as hk
from hvdkit.core.errors import ConfigError
from hvdkit.torch.zero import elements

STEPS = 24
SAVE = 12
OTHERS = ("Adamax", "NAdam", "RAdam", "RMSprop", "Adagrad", "Adadelta", "ASGD")
REGROW = 18  # the 1-rank job's own checkpoint, restored sharded at 2 ranks
CHUNK = 1000  # elements per consolidation round in ``bounded``
B = 3  # per-rank batch at 2 ranks
GLOBAL = 6


class Net(torch.nn.Module):
    """Two layers, a frozen offset and a scalar gain, in three param groups (see ``groups``)."""

    def __init__(self):
        super().__init__()
        self.l1 = torch.nn.Linear(7, 5)
        self.l2 = torch.nn.Linear(5, 3)
        self.offset = torch.nn.Parameter(torch.randn(3), requires_grad=False)
        self.gain = torch.nn.Parameter(torch.tensor(1.5))

    def forward(self, x):
        return self.gain * self.l2(torch.tanh(self.l1(x))) + self.offset


def make_model():
    torch.manual_seed(0)
    return Net()


def groups(model, kind):
    """Groups of 43 trainable elements (and the frozen offset), 15, and 1 (rank 1's slice of it is empty)."""
    first = [model.l1.weight, model.l1.bias, model.offset, model.l2.bias]
    second = [model.l2.weight]
    third = [model.gain]
    if kind == "sgd":
        return torch.optim.SGD(
            [{"params": first}, {"params": second, "lr": 0.02}, {"params": third, "lr": 0.01}], lr=0.05, momentum=0.9
        )
    if kind == "adam":
        return torch.optim.Adam(
            [{"params": first}, {"params": second, "lr": 3e-3}, {"params": third, "lr": 3e-3}], lr=1e-2
        )
    if kind == "adamw":
        return torch.optim.AdamW(
            [
                {"params": first, "weight_decay": 0.1},
                {"params": second, "lr": 3e-3},
                {"params": third, "weight_decay": 0.0},
            ],
            lr=1e-2,
        )
    cls = getattr(torch.optim, kind)  # the rest of the allow-list, by class name
    return cls([{"params": first}, {"params": second, "lr": 3e-3}, {"params": third}], lr=1e-2)


def batch(step, micro=0):
    g = torch.Generator().manual_seed(1000 * step + micro)
    x = torch.randn(GLOBAL, 7, generator=g)
    return x, torch.randn(GLOBAL, 3, generator=g) * 2


def local(tensor, rank, size):
    per = GLOBAL // size
    return tensor[rank * per : (rank + 1) * per]


def train(model, opt, steps, rank, size, passes=1):
    for s in steps:
        opt.zero_grad()
        for m in range(passes):
            x, y = batch(s, m)
            loss = torch.nn.functional.mse_loss(model(local(x, rank, size)), local(y, rank, size)) / passes
            loss.backward()
        opt.step()


def rel_diff(a, b):
    pa, pb = params_of(a).double(), params_of(b).double()
    return float(((pa - pb).abs() / pb.abs().clamp(min=1e-3)).max())


def per_element(state):
    """Elements of the state kept per parameter element (momentum, moments): every tensor but the step counts."""
    return sum(v.numel() for s in state.values() for k, v in s.items() if isinstance(v, torch.Tensor) and k != "step")


def compare(kind, rank, size, passes=1, max_grad_norm=None, compression="none"):
    sharded, plain = make_model(), make_model()
    opts = {}
    for name, model, shard in (("sharded", sharded, True), ("plain", plain, False)):
        opts[name] = hk.DistributedOptimizer(
            groups(model, kind),
            model=model,
            backward_passes_per_step=passes,
            max_grad_norm=max_grad_norm,
            compression=compression,
            shard_optimizer_state=shard,
        )
    norms = {"sharded": [], "plain": []}
    for s in range(STEPS):
        for name, model in (("sharded", sharded), ("plain", plain)):
            train(model, opts[name], [s], rank, size, passes)
            if max_grad_norm is not None:
                norms[name].append(float(opts[name].last_grad_norm))
    opts["sharded"].consolidate_state_dict(to=None)
    full, ref = opts["sharded"].state_dict(), opts["plain"].state_dict()
    state_diff = max(
        float((full["state"][i][k].double() - v.double()).abs().max())
        for i, entry in ref["state"].items()
        for k, v in entry.items()
    )
    return {
        "digest": params_digest(sharded),
        "rel_diff": rel_diff(sharded, plain),
        "moved": float((params_of(sharded) - params_of(make_model())).abs().max()),
        "state_elements": elements(opts["sharded"].state),
        "state_per_element": per_element(opts["sharded"].state),
        "plain_state_elements": elements(opts["plain"].state),
        "plain_state_per_element": per_element(opts["plain"].state),
        "state_dict_same_structure": (
            full["param_groups"] == ref["param_groups"]
            and sorted(full["state"]) == sorted(ref["state"])
            and all(
                list(full["state"][i]) == list(ref["state"][i])
                and all(full["state"][i][k].shape == v.shape for k, v in ref["state"][i].items())
                for i in ref["state"]
            )
        ),
        "state_dict_max_diff": state_diff,
        "compression": opts["sharded"].compression,
        "norms": norms["sharded"],
        "plain_norms": norms["plain"],
    }


def error_of(call, exc_type=ConfigError):
    try:
        call()
    except exc_type as e:
        return str(e)
    return None


def refused():
    model = make_model()
    lbfgs = torch.optim.LBFGS(model.parameters())
    return error_of(lambda: hk.DistributedOptimizer(lbfgs, model=model, shard_optimizer_state=True))


def state_errors(rank, size):
    """After a step: ``state_dict()`` without consolidating, and a state dict with state for some parameters only."""
    model = make_model()
    opt = hk.DistributedOptimizer(groups(model, "adam"), model=model, shard_optimizer_state=True)
    train(model, opt, [0], rank, size)
    unconsolidated = error_of(opt.state_dict)
    opt.consolidate_state_dict()  # to rank 0
    elsewhere = error_of(opt.state_dict) if rank != 0 else None
    opt.consolidate_state_dict(to=None)
    partial = opt.state_dict()
    del partial["state"][0]  # l1.weight, in the first group with others that keep their state
    return {
        "unconsolidated": unconsolidated,
        "elsewhere": elsewhere,
        "partial": error_of(lambda: opt.load_state_dict(partial), ValueError),
    }


class _GatherSpy:
    """Horovod's module, but ``grouped_allgather`` records the elements each call returned."""

    def __init__(self, hvd):
        self.hvd, self.received = hvd, []

    def __getattr__(self, name):
        return getattr(self.hvd, name)

    def grouped_allgather(self, tensors, **kwargs):
        outs = self.hvd.grouped_allgather(tensors, **kwargs)
        self.received.append(sum(o.numel() for o in outs))
        return outs

    def alltoall(self, tensor, **kwargs):
        out, splits = self.hvd.alltoall(tensor, **kwargs)
        self.received.append(out.numel())
        return out, splits


def bounded(rank, size):
    """Adam over 68,362 parameters, consolidated to rank 0 in rounds of ``CHUNK`` elements and to every rank."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.Tanh(), torch.nn.Linear(256, 10))
    opt = hk.DistributedOptimizer(
        torch.optim.Adam(model.parameters(), lr=1e-3), model=model, shard_optimizer_state=True
    )
    for s in range(2):
        g = torch.Generator().manual_seed(s)
        x, y = torch.randn(8, 256, generator=g), torch.randn(8, 10, generator=g)
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x[rank::size]), y[rank::size]).backward()
        opt.step()
    opt.chunk_elements = CHUNK
    spy = _GatherSpy(opt._hvd)  # counts what Horovod's all-gathers hand this rank, apart from the optimizer's own count
    opt._hvd = spy
    opt.consolidate_state_dict()
    opt._hvd = spy.hvd
    to_rank0 = dict(opt.last_consolidation, spied_largest=max(spy.received), spied_calls=len(spy.received))
    gathered = opt.state_dict() if rank == 0 else None
    opt.chunk_elements = 1 << 22
    opt.consolidate_state_dict(to=None)
    everywhere = dict(opt.last_consolidation)
    ref = opt.state_dict()
    same = gathered is None or (
        sorted(gathered["state"]) == sorted(ref["state"])
        and all(
            torch.equal(gathered["state"][i][k], v) if isinstance(v, torch.Tensor) else gathered["state"][i][k] == v
            for i, entry in ref["state"].items()
            for k, v in entry.items()
        )
    )
    # A restore: rank 0 loads the whole state into a fresh sharded Adam, broadcast_state scatters the slices.
    model2 = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.Tanh(), torch.nn.Linear(256, 10))
    opt2 = hk.DistributedOptimizer(
        torch.optim.Adam(model2.parameters(), lr=5e-4), model=model2, shard_optimizer_state=True
    )
    if rank == 0:
        model2.load_state_dict(model.state_dict())
        opt2.load_state_dict(gathered)
    opt2.chunk_elements = CHUNK
    spy = _GatherSpy(opt2._hvd)
    opt2._hvd = spy
    hk.broadcast_state(model2, opt2)
    opt2._hvd = spy.hvd
    slices_equal = len(opt2.state) == len(opt.state) == 1 and all(
        torch.equal(opt2.state[g2.shard][key], v)
        for g, g2 in zip(opt._groups, opt2._groups, strict=True)
        for key, v in opt.state[g.shard].items()
    )
    return {
        "to_rank0": to_rank0,
        "everywhere": everywhere,
        "state_per_element": per_element(ref["state"]),
        "same_as_everywhere": same,
        "chunk": CHUNK,
        "scatter": dict(
            opt2.last_scatter,
            spied_received=sum(spy.received),
            spied_largest=max(spy.received),
            spied_calls=len(spy.received),
            own_per_element=per_element(opt2.state),
            slices_equal=slices_equal,
            lr=opt2.param_groups[0]["lr"],
            params_equal=all(torch.equal(a, b) for a, b in zip(model.parameters(), model2.parameters())),
        ),
    }


AMP_STEPS = 12
INF_AT = 5  # the step at which rank 1 puts an inf into its own gradient of an element rank 0 owns


def amp_compare(rank, size, max_grad_norm=None):
    """fp16 loss scaling through ``hk.amp_step``, sharded and unsharded, on the same batches.

    At ``INF_AT`` rank 1 alone sets ``l1.weight.grad[0, 0]`` (in rank 0's slice) to inf: rank 1's own
    slice stays finite, so only the agreed flag makes it skip with rank 0, as the unsharded optimizer does.
    """
    models = {"sharded": make_model(), "plain": make_model()}
    opts, scalers = {}, {}
    for name, model in models.items():
        opts[name] = hk.DistributedOptimizer(
            groups(model, "adam"), model=model, max_grad_norm=max_grad_norm, shard_optimizer_state=name == "sharded"
        )
        scalers[name] = torch.amp.GradScaler("cpu", init_scale=1024.0, growth_interval=3)
    scales, skipped = {n: [] for n in models}, {n: [] for n in models}
    poison = [False]

    def inf_into(grad):  # a tensor hook: runs inside backward, before Horovod's hook takes the gradient
        if not poison[0]:
            return grad
        grad = grad.clone()
        grad[0, 0] = float("inf")
        return grad

    for model in models.values():
        model.l1.weight.register_hook(inf_into)
    for s in range(AMP_STEPS):
        poison[0] = s == INF_AT and rank == 1
        x, y = batch(s)
        for name, model in models.items():
            opts[name].zero_grad()
            with hk.autocast(dtype="float16"):
                loss = torch.nn.functional.mse_loss(model(local(x, rank, size)), local(y, rank, size))
            scalers[name].scale(loss).backward()
            before = params_of(model).clone()
            hk.amp_step(opts[name], scalers[name])
            scales[name].append(scalers[name].get_scale())
            skipped[name].append(bool(torch.equal(before, params_of(model))))
    return {
        "digest": params_digest(models["sharded"]),
        "rel_diff": rel_diff(models["sharded"], models["plain"]),
        "moved": float((params_of(models["sharded"]) - params_of(make_model())).abs().max()),
        "scales": scales["sharded"],
        "plain_scales": scales["plain"],
        "skipped": skipped["sharded"],
        "plain_skipped": skipped["plain"],
        "state_per_element": per_element(opts["sharded"].state),
        "plain_state_per_element": per_element(opts["plain"].state),
    }


def checkpointed(out, rank, size):
    """The uninterrupted sharded run, started as a script starts one (fresh ``broadcast_state``), saving at ``SAVE``."""
    model = make_model()
    opt = hk.DistributedOptimizer(groups(model, "adamw"), model=model, shard_optimizer_state=True)
    waits = []
    opt.add_synchronize_listener(waits.append)
    opt.chunk_elements = 5  # many rounds, pieces cut inside a rank's slice and across groups
    ckpt = hk.Checkpointer(os.path.join(out, "ckpt"), model, opt)
    hk.broadcast_state(model, opt)
    train(model, opt, range(SAVE), rank, size)
    ckpt.save(SAVE, 0)
    consolidation = opt.last_consolidation
    train(model, opt, range(SAVE, STEPS), rank, size)
    return {
        "final": params_of(model).tolist(),
        "digest": params_digest(model),
        "waits": len(waits),
        "consolidation": consolidation,
    }


def resumed(out, rank, size, shard):
    """Restore the newest checkpoint into a fresh AdamW (sharded or not) and train to ``STEPS``.

    Unsharded (the 1-rank job), it saves again at ``REGROW`` on the way, for the 2-rank sharded ``regrow``.
    """
    model = make_model()
    opt = hk.DistributedOptimizer(groups(model, "adamw"), model=model, shard_optimizer_state=shard)
    ckpt = hk.Checkpointer(os.path.join(out, "ckpt"), model, opt)
    resume = ckpt.restore()
    if shard:
        train(model, opt, range(resume.step, STEPS), rank, size)
    else:
        train(model, opt, range(resume.step, REGROW), rank, size)
        ckpt.save(REGROW, 0)
        train(model, opt, range(REGROW, STEPS), rank, size)
    return {
        "step": resume.step,
        "saved_size": resume.world_size,
        "final": params_of(model).tolist(),
        "digest": params_digest(model),
    }


def main(out, mode):
    topo = hk.init()
    rank, size = topo.rank, topo.size
    if mode == "train":
        result = {kind: compare(kind, rank, size) for kind in ("sgd", "adam", "adamw")}
        result["adam_accumulate_clip"] = compare("adam", rank, size, passes=2, max_grad_norm=0.05)
        result["adam_fp16"] = compare("adam", rank, size, compression="fp16")
        for kind in OTHERS:
            result[kind] = compare(kind, rank, size)
        result["refused"] = refused()
        result["amp"] = amp_compare(rank, size)
        result["amp_clip"] = amp_compare(rank, size, max_grad_norm=0.05)
        result["state_errors"] = state_errors(rank, size)
        result["bounded"] = bounded(rank, size)
        result["checkpoint"] = checkpointed(out, rank, size)
        result["resumed_sharded"] = resumed(out, rank, size, shard=True)
        result["recipes"] = zero_recipes_torch.run(rank, size)
    elif mode == "resume":
        result = resumed(out, rank, size, shard=False)
    else:  # regrow
        result = resumed(out, rank, size, shard=True)
    with open(os.path.join(out, f"{mode}-rank{rank}.json"), "w") as f:
        json.dump({"rank": rank, "size": size, **result}, f)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
