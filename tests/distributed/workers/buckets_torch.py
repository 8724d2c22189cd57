"""Runs on every rank of a real 2-rank torch job: ``bucket_mb=`` against no buckets, bitwise.

A 4-layer MLP (3,301 trainable elements, 13.2 KB of fp32 gradients) is trained from one initial
state on rank-dependent batches, once with ``hk.DistributedOptimizer(..., bucket_mb=BUCKET_MB)``
(4 KiB buckets: several grouped allreduces per step, each started by its last gradient's hook) and
once without, in four cases: SGD with momentum; Adam with ``backward_passes_per_step=2``; SGD with
fp16 compression; SGD on a model with a layer that no rank uses (its gradient stays None). Each run
records its parameters' digest and the optimizer's ``bucket_sizes``. Also: ``bucket_mb`` with
``shard_optimizer_state=True`` and a negative ``bucket_mb`` must raise ConfigError.
Writes OUT/rank<r>.json. Usage: python buckets_torch.py OUT
"""

import json
import os
import sys
import traceback

import torch
from model_params import params_digest

import hvdkit.torch as hk
from hvdkit.core.errors import ConfigError

STEPS = 4
B = 4  # per-rank batch
BUCKET_MB = 4 / 1024  # 4 KiB


class Net(torch.nn.Module):
    def __init__(self, unused=False):
        super().__init__()
        torch.manual_seed(0)
        self.first = torch.nn.Linear(12, 32)
        self.unused = torch.nn.Linear(7, 7) if unused else None  # no rank runs it: its gradient stays None
        self.rest = torch.nn.ModuleList([torch.nn.Linear(32, 48), torch.nn.Linear(48, 24), torch.nn.Linear(24, 5)])

    def forward(self, x):
        x = torch.tanh(self.first(x))
        for i, layer in enumerate(self.rest):
            x = layer(x)
            x = torch.tanh(x) if i < len(self.rest) - 1 else x
        return x


def batch(step, micro, rank):
    g = torch.Generator().manual_seed(100 * step + 10 * micro + rank)
    return torch.randn(B, 12, generator=g), torch.randn(B, 5, generator=g)


def run(bucket_mb, rank, kind="sgd", passes=1, compression="none", unused=False):
    model = Net(unused)
    base = (
        torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        if kind == "sgd"
        else torch.optim.Adam(model.parameters(), lr=1e-2)
    )
    opt = hk.DistributedOptimizer(
        base, model=model, backward_passes_per_step=passes, compression=compression, bucket_mb=bucket_mb
    )
    for s in range(STEPS):
        opt.zero_grad()
        for m in range(passes):
            x, y = batch(s, m, rank)
            (torch.nn.functional.mse_loss(model(x), y) / passes).backward()
        opt.step()
    return {"digest": params_digest(model), "bucket_sizes": opt.bucket_sizes}


def refusals():
    """The ConfigError messages of bucket_mb with ZeRO-1 and of a negative bucket_mb."""
    out = {}
    for name, kwargs in {
        "sharded": {"shard_optimizer_state": True, "bucket_mb": 25},
        "negative": {"bucket_mb": -1},
    }.items():
        model = Net()
        try:
            hk.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model=model, **kwargs)
            out[name] = None
        except ConfigError as e:
            out[name] = str(e)
    return out


CASES = {
    "sgd": {},
    "adam_accumulate": {"kind": "adam", "passes": 2},
    "fp16": {"compression": "fp16"},
    "unused": {"unused": True},
}


def main(out):
    rank = hk.init().rank
    result = {}
    try:
        for name, kwargs in CASES.items():
            result[name] = {"on": run(BUCKET_MB, rank, **kwargs), "off": run(None, rank, **kwargs)}
        result["refusals"] = refusals()
    except Exception:  # noqa: BLE001 - recorded for the test to show
        result["failure"] = traceback.format_exc()
    with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
