"""Benchmark worker: training-step throughput of a synthetic PyTorch model on 1 and N ranks.

    hvdkit run -np 2 -- python -m hvdkit.bench.train_bench OUT.json [--quick]

Variants, interleaved in one job: ``single`` (rank 0 alone, plain optimizer, the others wait
without spinning), ``hvdkit`` (``hvdkit.torch.DistributedOptimizer``), ``horovod`` (a raw
``horovod.torch`` loop) and ``ddp`` (``torch.nn.parallel.DistributedDataParallel`` over gloo), and
``compute_only`` (every rank steps a plain optimizer, nothing averaged: what sharing the machine
alone costs); with
``--fp16`` also ``hvdkit_fp16`` (``compression="fp16"``), and with ``--auto`` the job records what
``compression="auto"`` picks for this model (``hvdkit.torch.autocompress``) with both times; with
``--bucket`` also ``hvdkit_bucket`` (``bucket_mb=25``, DDP's buckets; checked bitwise equal to ``hvdkit``).
Each rank keeps its own batch size (weak scaling), so scaling efficiency = t_single / t_variant.
Before timing, the three distributed variants train a few steps from one initial state and must
end with parameters identical across ranks and equal to each other. Rank 0 writes OUT.json.
"""

import argparse
import copy
import json
import os
import sys
import time

from hvdkit.core.horovod_settings import HOROVOD_DEFAULTS

from .comm_bench import Job
from .stats import Samples, check_close, interleaved, timed

# Communication is 10-30 % of a step for this model on one CPU core per rank (measured: "comm_share").
WIDTH, DEPTH, BATCH = 1024, 4, 128
QUICK = (64, 2, 8)
VARIANTS = ("single", "compute_only", "hvdkit", "horovod", "ddp", "hvdkit_fp16", "hvdkit_bucket")
BUCKET_MB = 25
FP16_TOL = 1e-2  # fp16 averaging moves the parameters in the 3rd-4th digit over the check's steps


def build_model(torch, width, depth, seed=0):
    torch.manual_seed(seed)
    layers = []
    for _ in range(depth):
        layers += [torch.nn.Linear(width, width), torch.nn.ReLU()]
    return torch.nn.Sequential(*layers, torch.nn.Linear(width, 10))


class TrainJob(Job):
    def __init__(self, width, depth, batch, fp16=False, bucket=False):
        super().__init__()
        self.distributed = ("hvdkit", "horovod", "ddp") + (("hvdkit_fp16",) if fp16 else ())
        self.distributed += ("hvdkit_bucket",) if bucket else ()
        torch = self.torch
        self.width, self.depth, self.batch = width, depth, batch
        g = torch.Generator().manual_seed(1000 + self.rank)
        self.x = torch.randn(batch, width, generator=g)
        self.y = torch.randint(0, 10, (batch,), generator=g)

    def variants(self):
        """{name: step()} each with its own model copy, all starting from the same parameters."""
        import hvdkit.torch as hk

        torch, hvd = self.torch, self.hvd
        base = build_model(torch, self.width, self.depth)
        out = {}

        def make_step(model, opt):
            def step():
                opt.zero_grad()
                torch.nn.functional.cross_entropy(model(self.x), self.y).backward()
                opt.step()

            return step, model

        m = copy.deepcopy(base)
        out["single"] = make_step(m, torch.optim.SGD(m.parameters(), lr=0.01))
        m = copy.deepcopy(base)
        out["compute_only"] = make_step(m, torch.optim.SGD(m.parameters(), lr=0.01))  # every rank, no allreduce
        m = copy.deepcopy(base)
        out["hvdkit"] = make_step(m, hk.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.01), model=m))
        m = copy.deepcopy(base)
        raw = hvd.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.01), named_parameters=m.named_parameters())
        hvd.broadcast_parameters(m.state_dict(), root_rank=0)
        out["horovod"] = make_step(m, raw)
        m = copy.deepcopy(base)
        ddp = torch.nn.parallel.DistributedDataParallel(m)
        out["ddp"] = make_step(ddp, torch.optim.SGD(ddp.parameters(), lr=0.01))
        if "hvdkit_fp16" in self.distributed:
            m = copy.deepcopy(base)
            opt = hk.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.01), model=m, compression="fp16")
            out["hvdkit_fp16"] = make_step(m, opt)
        if "hvdkit_bucket" in self.distributed:
            m = copy.deepcopy(base)
            opt = hk.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.01), model=m, bucket_mb=BUCKET_MB)
            out["hvdkit_bucket"] = make_step(m, opt)
        return out

    def flat(self, model):
        return self.torch.cat([p.detach().reshape(-1) for p in model.parameters()])

    def check(self, variants, steps=3):
        """Distributed variants: identical on every rank and equal to each other after ``steps``."""
        for name in self.distributed:
            for _ in range(steps):
                variants[name][0]()
        params = {n: self.flat(variants[n][1]) for n in self.distributed}
        worst = {}
        for n, p in params.items():
            gathered = self.hvd.allgather_object(p[:1000].tolist(), name=f"bench.check.{n}")
            worst[f"{n}_across_ranks"] = check_close(f"{n} parameters across ranks", gathered[0], gathered[-1], 0.0)
        for n in self.distributed[1:]:
            tol = FP16_TOL if n.endswith("fp16") else 0.0 if n == "hvdkit_bucket" else 1e-5
            worst[f"{n}_vs_hvdkit"] = check_close(
                f"{n} vs hvdkit parameters", params[n].tolist(), params["hvdkit"].tolist(), tol
            )
        return worst

    def time_single(self, step, steps):
        """Rank 0 steps alone while the other ranks block in a gloo barrier (no spinning)."""
        seconds = None
        if self.rank == 0:
            seconds = timed(step, steps)
        self.barrier()
        return self.hvd.broadcast_object(seconds, root_rank=0, name="bench.single")

    def comm_share(self, seconds_per_step, reps=5):
        """Seconds to average all gradients once (one grouped allreduce) / seconds per hvdkit step."""
        grads = [p.detach().clone() for p in build_model(self.torch, self.width, self.depth).parameters()]
        self.hvd.grouped_allreduce_(grads, name="bench.comm_share")
        s = Samples(timed(lambda: self.hvd.grouped_allreduce_(grads, name="bench.comm_share"), 3) for _ in range(reps))
        return s.median / seconds_per_step

    def allreduce_latency(self, reps=5, iters=50):
        """Seconds per 4 KB allreduce: Horovod's small-message floor (its cycle time shows here)."""
        t = self.torch.zeros(1024)
        self.hvd.allreduce_(t, name="bench.latency")
        return Samples(timed(lambda: self.hvd.allreduce_(t, name="bench.latency"), iters) for _ in range(reps)).median

    def idle_cpu(self, seconds=1.0):
        """CPU seconds this rank's process burns per second while the training loop sleeps.

        What Horovod's background thread costs between collectives: it wakes every cycle
        (HOROVOD_CYCLE_TIME) and negotiates with the other ranks, also when nothing is pending.
        CPU time, unlike wall time, hardly moves with other load on the machine.
        """
        self.barrier()
        cpu0, wall0 = time.process_time(), time.perf_counter()
        time.sleep(seconds)
        return (time.process_time() - cpu0) / (time.perf_counter() - wall0)

    def auto_compression(self):
        """What ``compression="auto"`` picks for this model now: its Decision as a dict (both times).

        None when this hvdkit has no ``hvdkit.torch.autocompress`` (the hook the network section fills).
        Collective: every rank calls it.
        """
        try:
            from hvdkit.torch.autocompress import measure_and_choose
        except ImportError:
            return None
        return measure_and_choose(build_model(self.torch, self.width, self.depth)).as_dict()

    def run(self, reps, steps, only=None):
        variants = self.variants()
        checks = self.check(variants)
        if only:
            variants = {v: f for v, f in variants.items() if v in only or v == "single"}
        samples = {v: Samples() for v in variants}
        for rep, v in interleaved(list(variants), reps):
            step = variants[v][0]
            if v == "single":
                samples[v].add(self.time_single(step, steps))
                continue
            self.barrier()
            step()
            samples[v].add(timed(step, steps))
            if v == list(variants)[-1]:
                self.progress(f"training rep {rep + 1}/{reps} done")
        single = samples["single"].median
        out = {}
        for v, s in samples.items():
            ranks = 1 if v == "single" else self.size  # compute_only: the ceiling with no communication at all
            out[v] = {
                **s.as_dict(),
                "samples_per_s": ranks * self.batch / s.median,
                "scaling_efficiency": single / s.median if v != "single" else 1.0,
            }
        return {
            "model": {
                "width": self.width,
                "depth": self.depth,
                "batch_per_rank": self.batch,
                "parameters": sum(p.numel() for p in variants["single"][1].parameters()),
            },
            "steps_per_sample": steps,
            "checks": checks,
            "comm_share": self.comm_share(samples["hvdkit"].median),
            "allreduce_4k_s": self.allreduce_latency(),
            "idle_cpu": self.idle_cpu(0.2 if steps <= 2 else 1.0),
            "horovod_env": {k: os.environ.get(k) for k in HOROVOD_DEFAULTS},  # what Horovod started with
            "variants": out,
        }


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out")
    p.add_argument("--quick", action="store_true", help="tiny model, 1 repetition: checks, not figures")
    # Many short samples: a slow spell on a shared machine spoils one sample, not a variant's median.
    p.add_argument("--reps", type=int, default=15)
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--only", nargs="+", choices=VARIANTS, help="time only these (and the single-rank baseline)")
    p.add_argument("--fp16", action="store_true", help="also time hvdkit with compression='fp16'")
    p.add_argument("--bucket", action="store_true", help=f"also time hvdkit with bucket_mb={BUCKET_MB}")
    p.add_argument("--auto", action="store_true", help="also record what compression='auto' picks for this model")
    args = p.parse_args(argv)
    width, depth, batch = QUICK if args.quick else (WIDTH, DEPTH, BATCH)
    only = args.only or ()
    fp16, bucket = args.fp16 or "hvdkit_fp16" in only, args.bucket or "hvdkit_bucket" in only
    job = TrainJob(width, depth, batch, fp16=fp16, bucket=bucket)
    t0 = time.perf_counter()
    result = job.run(1 if args.quick else args.reps, 2 if args.quick else args.steps, args.only)
    if args.auto:
        result["auto_compression"] = job.auto_compression()
    result["seconds"] = time.perf_counter() - t0
    job.dist.destroy_process_group()
    if job.rank == 0:
        with open(args.out, "w", encoding="utf-8") as f:
            json.dump(result, f, indent=1)
        print(f"[bench train] done in {result['seconds']:.1f} s", file=sys.stderr)


if __name__ == "__main__":
    main()
