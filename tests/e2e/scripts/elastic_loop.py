"""A hand-written torch loop under `@hk.elastic.run` (the README's "In-process recovery" API) on the digits data.

    elastic_loop.py OUT [--epochs 3] [--sample-log PREFIX] [--shard]

Global batch 64 (the accumulation follows the world size), SGD with momentum and a per-epoch cosine
schedule, a commit every 5 steps and at every epoch end. Rank 0 (whichever process it is at the end)
writes the final parameters to OUT (a .npz) and prints one JSON line with the steps trained.
"""

import argparse
import json
import os
import sys

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "examples"))
from digits_common import SampleLog, torch_datasets, torch_model  # noqa: E402

import hvdkit.torch as hk  # noqa: E402


def main():
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--sample-log", default=None)
    p.add_argument("--shard", action="store_true", help="ZeRO-1: shard_optimizer_state=True")
    args = p.parse_args()
    hk.init()
    torch.manual_seed(0)
    train_set, _ = torch_datasets(0)
    model = torch_model()
    sgd = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    opt = hk.DistributedOptimizer(sgd, model=model, shard_optimizer_state=args.shard)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=args.epochs)
    log = SampleLog(args.sample_log, hk.rank, hk.size)
    state = hk.elastic.State(model, opt, objects={"sched": sched}, epoch=0, step=0, samples_done=0)

    @hk.elastic.run
    def train(state):
        loader = hk.train_loader(train_set, 32, global_batch_size=64, seed=0)
        hk.elastic.set_accumulation(opt, loader.accumulation)
        for epoch in range(state.epoch, args.epochs):
            loader.sampler.set_epoch(epoch, start=state.samples_done)
            read = []
            for i, (x, y, index) in enumerate(loader, 1):
                (F.cross_entropy(model(x), y) / loader.accumulation).backward()
                read += index.tolist()
                if i % loader.accumulation:
                    continue
                opt.step()
                opt.zero_grad()
                state.step += 1
                log.write(epoch, state.step, read)
                read = []
                state.samples_done = loader.position(i // loader.accumulation)
                state.commit_every(5)
            sched.step()
            state.epoch, state.samples_done = epoch + 1, 0
            state.commit()
        return state.step

    steps = train(state)
    if hk.rank() == 0:
        np.savez(args.out, **{k: v.numpy() for k, v in model.state_dict().items()})
        print(json.dumps({"steps": steps, "size": hk.size(), "recoveries": len(state.recoveries)}), flush=True)


if __name__ == "__main__":
    main()
