"""A subclass of the class hvd.DistributedOptimizer builds, on 2 real ranks, in users' own style.

Users extend Horovod's optimizer by subclassing ``type(opt)`` and calling ``super()``, here to
count and time ``synchronize()`` and ``step()``. Upstream, every method of that class called
``super(self.__class__, self)``, which in a subclass is the subclass again: RecursionError.
Every rank writes OUT/rank<r>.json: per optimizer, the digest of the trained parameters, the largest
difference from one process trained on the concatenated batches, and the calls counted, or the
error. Usage: python hvd_torch_subclass.py OUT
"""

import copy
import json
import os
import sys
import time
import traceback

import torch
import torch.nn.functional as F

import horovod.torch as hvd
from torch_reference import batches as reference_batches
from torch_reference import digest, flat, make_base, make_model, max_diff
from torch_reference import reference as one_process

STEPS = 3
B = 4  # per-rank batch


def batches():
    return reference_batches(STEPS, hvd.size(), B)


def timed_subclass(opt):
    """``type(opt)`` extended the usual way: count and time synchronize(), count step()."""

    class Timed(type(opt)):
        def __init__(self, *args, **kwargs):
            self.sync_calls, self.step_calls, self.sync_seconds = 0, 0, 0.0
            super().__init__(*args, **kwargs)

        def synchronize(self):
            start = time.perf_counter()
            try:
                return super().synchronize()
            finally:
                self.sync_calls += 1
                self.sync_seconds += time.perf_counter() - start

        def step(self, closure=None):
            self.step_calls += 1
            return super().step(closure)

    return Timed


def train(opt_name):
    model = make_model(seed=hvd.rank())  # different on every rank until broadcast
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    init = copy.deepcopy(model)
    named = list(model.named_parameters())
    probe = hvd.DistributedOptimizer(make_base(opt_name, make_model(0)))
    cls = timed_subclass(probe)
    # Built like Horovod builds its own: the base optimizer's param groups, then Horovod's arguments.
    opt = cls(make_base(opt_name, model).param_groups, named, hvd.Compression.none)
    hvd.broadcast_optimizer_state(opt, root_rank=0)  # load_state_dict on the other ranks
    x, y = batches()
    mine = slice(hvd.rank() * B, (hvd.rank() + 1) * B)
    for s in range(STEPS):
        opt.zero_grad(set_to_none=True)
        F.mse_loss(model(x[s][mine]), y[s][mine]).backward()
        opt.step()
    diff = max_diff(model, one_process(init, opt_name, STEPS, hvd.size(), B))
    return {
        "digest": digest(model),
        "max_diff_vs_reference": diff,
        "moved": float((flat(model) - flat(init)).abs().max()),
        "sync_calls": opt.sync_calls,
        "step_calls": opt.step_calls,
        "is_horovod_class": isinstance(opt, type(probe)),
    }


def main(out_dir):
    hvd.init()
    torch.set_num_threads(1)
    record = {}
    for name in ("sgd", "adamw"):
        try:
            record[name] = train(name)
        except Exception as e:  # recorded for the test to report, not hidden
            record[name] = {"error": f"{type(e).__name__}: {str(e)[:300]}", "traceback": traceback.format_exc()[-1500:]}
    with open(os.path.join(out_dir, f"rank{hvd.rank()}.json"), "w") as f:
        json.dump(record, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
