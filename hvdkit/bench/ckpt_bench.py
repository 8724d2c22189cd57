"""Benchmark worker, one process: hvdkit checkpoint save against plain ``torch.save``.

    python -m hvdkit.bench.ckpt_bench OUT.json [--quick]

Variants, interleaved: ``torch_save`` (``torch.save`` to a file), ``torch_save_fsync`` (the same,
then ``fsync`` of the file and its folder: what durable means) and ``hvdkit`` (``Checkpointer.save``:
model + optimizer + RNG, written to a temporary folder, fsynced, hashed into a manifest, renamed
into place, old ones pruned in the background). Each variant's file is loaded back and compared
before timing. Every sample starts after ``os.sync()`` and after hvdkit's background deletion of
pruned checkpoints has finished (both untimed): what is timed is how long the training loop waits.
"""

import argparse
import json
import os
import shutil
import sys
import tempfile
import time

from .stats import Samples, check_close, interleaved

MEGABYTES = 64
QUICK_MEGABYTES = 1


def run(megabytes, reps, root):
    import torch

    import hvdkit.torch as hk
    from hvdkit.core.checkpoint import fsync_path
    from hvdkit.core.comm import LocalCommunicator

    side = int((megabytes * 2**20 / 4 / 2) ** 0.5)  # two square layers of fp32
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(side, side), torch.nn.Linear(side, side))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)  # no state: the payload is the model
    nbytes = sum(p.numel() * p.element_size() for p in model.parameters())
    ckpt = hk.Checkpointer(os.path.join(root, "hvdkit"), model, opt, keep=2, comm=LocalCommunicator())
    plain = os.path.join(root, "plain.pt")
    counter = iter(range(1, 10**6))

    def torch_save():
        torch.save({"model": model.state_dict(), "optimizer": opt.state_dict()}, plain)

    def torch_save_fsync():
        torch_save()
        fsync_path(plain)
        fsync_path(root, directory=True)

    def hvdkit_save():
        ckpt.save(step=next(counter), epoch=0)

    variants = {"torch_save": torch_save, "torch_save_fsync": torch_save_fsync, "hvdkit": hvdkit_save}
    want = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    checks = {}
    for name, fn in variants.items():
        fn()
        if name == "hvdkit":
            other = torch.nn.Sequential(torch.nn.Linear(side, side), torch.nn.Linear(side, side))
            hk.Checkpointer(os.path.join(root, "hvdkit"), other, comm=LocalCommunicator()).restore()
            got = torch.cat([p.detach().reshape(-1) for p in other.parameters()])
        else:
            state = torch.load(plain, weights_only=True)["model"]
            got = torch.cat([state[k].reshape(-1) for k in model.state_dict()])
        worst = float((got - want).abs().max()) if got.shape == want.shape else float("inf")
        checks[name] = check_close(f"checkpoint {name} read back", [worst], [0.0], 0.0)
    samples = {v: Samples() for v in variants}
    for rep, v in interleaved(list(variants), reps):
        # Untimed: no dirty pages left by the previous variant (its writeback would land on this
        # one's fsync), and no pruned checkpoint still being deleted in the background.
        ckpt.store.wait_for_cleanup()
        os.sync()
        t0 = time.perf_counter()
        variants[v]()
        samples[v].add(time.perf_counter() - t0)
        if v == "hvdkit":
            print(f"[bench checkpoint] rep {rep + 1}/{reps} done", file=sys.stderr, flush=True)
    return {
        "payload_bytes": nbytes,
        "checks": checks,
        "variants": {v: s.as_dict() for v, s in samples.items()},
        "hvdkit_vs_torch_save_fsync": samples["hvdkit"].median / samples["torch_save_fsync"].median,
        "hvdkit_vs_torch_save": samples["hvdkit"].median / samples["torch_save"].median,
    }


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out")
    p.add_argument("--quick", action="store_true", help="1 MB, 1 repetition: checks, not figures")
    p.add_argument("--reps", type=int, default=7)
    p.add_argument("--dir", default=None, help="where to write (default: a temporary folder); the disk is part of the result")
    args = p.parse_args(argv)
    root = tempfile.mkdtemp(prefix="hvdkit-bench-ckpt-", dir=args.dir)
    try:
        result = run(QUICK_MEGABYTES if args.quick else MEGABYTES, 1 if args.quick else args.reps, root)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
