"""Runs on every rank of a real 2-rank torch job: compression="auto" (measure, decide, override, errors).

Writes OUT/rank<r>.json. The choice rank 0 logged is broadcast, so every rank can check that its
training matches it: "none" must equal one process on the global batch to 1e-6, "fp16" must differ.
Usage: python autocompress_torch.py OUT
"""

import copy
import sys
from functools import partial

import horovod.torch as hvd
import torch
from model_params import max_param_diff, params_digest
from recording import error_of, logged_runs, with_env, write_rank_result

import hvdkit.torch as hk
from hvdkit.torch.autocompress import measure_and_choose

STEPS, B, LR = 3, 4, 0.1
VAR = "HVDKIT_COMPRESSION"


def make_model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 64), torch.nn.Tanh(), torch.nn.Linear(64, 4))


def batches(size):
    g = torch.Generator().manual_seed(7)
    return torch.randn(STEPS, size * B, 8, generator=g), torch.randn(STEPS, size * B, 4, generator=g)


def train(init, x, y, rank, compression):
    model = copy.deepcopy(init)
    opt = hk.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=LR), model=model, compression=compression)
    mine = slice(rank * B, (rank + 1) * B)
    for s in range(STEPS):
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x[s][mine]), y[s][mine]).backward()
        opt.step()
    return model


def reference(init, x, y):
    model = copy.deepcopy(init)
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    for s in range(STEPS):
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x[s]), y[s]).backward()
        opt.step()
    return model


def main(out_dir):
    topo = hk.init(threads=1)
    init = make_model()
    x, y = batches(topo.size)
    ref = reference(init, x, y)
    out = {"rank": topo.rank, "measured": measure_and_choose(init).as_dict()}
    rank1_only = "fp16" if topo.rank == 1 else None  # a variable set on one host only: rank 0's view wins
    runs = [
        (label, partial(with_env, VAR, env, partial(train, init, x, y, topo.rank, arg)))
        for label, arg, env in [
            ("auto", "auto", None),
            ("auto_env_fp16", "auto", "fp16"),
            ("auto_env_none", "auto", "none"),
            ("explicit_none_env_fp16", "none", "fp16"),
            ("explicit_fp16", "fp16", None),
            ("auto_env_fp16_on_rank1_only", "auto", rank1_only),
        ]
    ]
    rank0_view = partial(hvd.broadcast_object, root_rank=0, name="test.autocompress.logged")
    out["runs"] = logged_runs(
        "hvdkit.autocompress",
        runs,
        rank0_view,
        lambda model: {"digest": params_digest(model), "max_diff_vs_reference": max_param_diff(model, ref)},
    )
    plain = torch.optim.SGD(init.parameters(), lr=LR)
    out["errors"] = {
        "argument": error_of(lambda: hk.DistributedOptimizer(plain, compression="int8"), ValueError),
        "variable": with_env(
            VAR, "bf16", lambda: error_of(lambda: hk.DistributedOptimizer(plain, compression="auto"), ValueError)
        ),
    }
    write_rank_result(out_dir, topo.rank, out)


if __name__ == "__main__":
    main(sys.argv[1])
