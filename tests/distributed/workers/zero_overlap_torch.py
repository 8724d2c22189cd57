"""Runs on every rank of a real 2-rank torch job: ZeRO-1's reduce-scatter overlapped with backward.

A 4-layer MLP (3,301 trainable elements) with ``round_elements=256`` (13 rounds) is trained sharded
with the overlap on and off, on the same batches: SGD+momentum, Adam with 2 accumulated passes and
fp16 on the wire, and a model with an unused layer first (its gradient stays None). Each run records its
parameters' digest, ``last_rounds``, and how many rounds had started when the backward pass came
between layers 1 and 0 (a probe there), i.e. while backward still had the first layer to do. Then: a third backward with
``backward_passes_per_step=2`` must raise ConfigError on every rank, and after ``zero_grad()`` the run
must go on and end bitwise where the overlap-off run with the same sequence ends. And two branches
whose rounds complete in a different order on each rank (reversed; or one branch unused on rank 1)
must finish, bitwise as with the overlap off.
Writes OUT/rank<r>.json. Usage: python zero_overlap_torch.py OUT
"""

import json
import os
import sys
import traceback

import torch
from model_params import params_digest

import hvdkit.torch as hk
from hvdkit.core.errors import ConfigError

STEPS = 6
ROUND = 256
B = 4  # per-rank batch


class Probe(torch.autograd.Function):
    """Identity whose backward notes how many reduce-scatter rounds had started by the time it runs."""

    seen = []

    @staticmethod
    def forward(ctx, x, opt):
        ctx.opt = opt
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        Probe.seen.append(ctx.opt._early.started)
        return grad, None


class Net(torch.nn.Module):
    def __init__(self, unused=False):
        super().__init__()
        torch.manual_seed(0)
        # no gradient ever: registered first, so only round 0 (started last, in round_order) waits for step()
        self.unused = torch.nn.Linear(5, 5) if unused else None
        self.layers = torch.nn.ModuleList(
            [torch.nn.Linear(12, 32), torch.nn.Linear(32, 48), torch.nn.Linear(48, 24), torch.nn.Linear(24, 5)]
        )
        self.opt = None

    def forward(self, x):
        for i, layer in enumerate(self.layers):
            x = layer(x)
            x = torch.tanh(x) if i < len(self.layers) - 1 else x
            if i == 0:  # backward passes here after layers 3-1 and before layer 0
                x = Probe.apply(x, self.opt)
        return x


def batch(step, micro, rank):
    g = torch.Generator().manual_seed(100 * step + 10 * micro + rank)
    return torch.randn(B, 12, generator=g), torch.randn(B, 5, generator=g)


def run(kind, overlap, rank, passes=1, compression="none", unused=False):
    model = Net(unused)
    base = (
        torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        if kind == "sgd"
        else torch.optim.Adam(model.parameters(), lr=1e-2)
    )
    opt = hk.DistributedOptimizer(
        base, model=model, shard_optimizer_state=True, backward_passes_per_step=passes, compression=compression
    )
    opt.round_elements = ROUND
    opt.overlap = overlap
    model.opt = opt
    Probe.seen = []
    for s in range(STEPS):
        opt.zero_grad()
        for m in range(passes):
            x, y = batch(s, m, rank)
            (torch.nn.functional.mse_loss(model(x), y) / passes).backward()
        opt.step()
    return {"digest": params_digest(model), "rounds": opt.last_rounds, "started_at_input": list(Probe.seen)}


class Branches(torch.nn.Module):
    """Branches A and B of two layers each, registered A1, B1, A2, B2 (272 elements each).

    Rank 0's slice is A1+B1 and rank 1's A2+B2: with ``BRANCH_ROUND`` (32 elements of each rank a round,
    17 rounds) rounds 0-7 need only branch A's gradients, 9-16 only branch B's, 8 both. Backward runs the
    branch computed last first.
    """

    def __init__(self):
        super().__init__()
        torch.manual_seed(1)
        self.a1, self.b1, self.a2, self.b2 = (torch.nn.Linear(16, 16) for _ in range(4))

    def forward(self, x, order):
        out = 0
        for branch in order:
            first, second = (self.a1, self.a2) if branch == "a" else (self.b1, self.b2)
            out = out + second(torch.tanh(first(x)))
        return out


BRANCH_ROUND = 64
# the branches each rank runs, in order: rank 1 skips B (its gradients stay None there), or runs them reversed
ORDERS = {"asymmetric": (("a", "b"), ("a",)), "branches": (("a", "b"), ("b", "a"))}


def branches(case, overlap, rank):
    """Rounds completed in a different order on each rank (or never on one): 3 steps, overlap on or off."""
    model = Branches()
    opt = hk.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9), model=model, shard_optimizer_state=True
    )
    opt.round_elements = BRANCH_ROUND
    opt.overlap = overlap
    for s in range(3):
        g = torch.Generator().manual_seed(10 * s + rank)
        x, y = torch.randn(B, 16, generator=g), torch.randn(B, 16, generator=g)
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x, ORDERS[case][rank]), y).backward()
        opt.step()
    return {"digest": params_digest(model), "rounds": opt.last_rounds}


def too_many_passes(overlap, rank):
    """A third backward with passes=2 (an error with the overlap), zero_grad(), then 2 more steps."""
    model = Net()
    opt = hk.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
        model=model,
        shard_optimizer_state=True,
        backward_passes_per_step=2,
    )
    opt.round_elements = ROUND
    opt.overlap = overlap
    model.opt = opt
    error = None
    opt.zero_grad()
    try:
        for m in range(3):
            x, y = batch(0, m, rank)
            torch.nn.functional.mse_loss(model(x), y).backward()
    except ConfigError as e:
        error = str(e)
    for s in (1, 2):
        opt.zero_grad()
        for m in range(2):
            x, y = batch(s, m, rank)
            torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    return {"error": error, "digest": params_digest(model)}


def main(out):
    topo = hk.init()
    rank = topo.rank
    result = {}
    cases = {
        "sgd": {"kind": "sgd"},
        "adam_accumulate_fp16": {"kind": "adam", "passes": 2, "compression": "fp16"},
        "unused": {"kind": "sgd", "unused": True},
    }
    try:
        for case in ORDERS:  # first: with a deadlock here, no other case runs and the job times out
            result[case] = {"on": branches(case, True, rank), "off": branches(case, False, rank)}
        for name, kwargs in cases.items():
            result[name] = {
                "on": run(overlap=True, rank=rank, **kwargs),
                "off": run(overlap=False, rank=rank, **kwargs),
            }
        result["too_many"] = {"on": too_many_passes(True, rank), "off": too_many_passes(False, rank)}
    except Exception:  # noqa: BLE001 - recorded for the test to show
        result["failure"] = traceback.format_exc()
    with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
