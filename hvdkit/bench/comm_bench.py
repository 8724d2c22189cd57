"""Benchmark worker, one job of N ranks: allreduce sweep, fp16 compression and tensor fusion.

    hvdkit run -np 2 -- python -m hvdkit.bench.comm_bench OUT.json [--quick]
    hvdkit run -np 2 --gloo -- python -m hvdkit.bench.comm_bench OUT.json [--quick]

Variants timed in this job, interleaved: Horovod allreduce (started by ``hvdkit.torch.init``, so
with hvdkit's settings) over the controller the job was launched with, mpi4py ``Allreduce`` (MPI
jobs), ``torch.distributed`` with gloo, and a memory copy of the same buffer on every rank at once
(the ceiling a shared-memory transport cannot beat). Every variant's result is checked first.
Rank 0 writes OUT.json.
"""

import argparse
import json
import os
import socket
import sys

import numpy as np

from .stats import Samples, bus_bandwidth, check_close, interleaved, iterations_for, timed

SIZES = [4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20]
QUICK_SIZES = [4 << 10, 64 << 10]
FUSION_TENSORS = 100
FUSION_ELEMENTS = 4096  # 16 KB each: 1.6 MB in all


class RecordingFP16:
    """Horovod's fp16 compression, recording the bytes of every tensor it hands to the engine."""

    sent_bytes = 0
    original_bytes = 0

    @classmethod
    def reset(cls):
        cls.sent_bytes = cls.original_bytes = 0

    @classmethod
    def compress(cls, tensor):
        import horovod.torch as hvd

        out, ctx = hvd.Compression.fp16.compress(tensor)
        cls.original_bytes += tensor.numel() * tensor.element_size()
        cls.sent_bytes += out.numel() * out.element_size()
        return out, ctx

    @staticmethod
    def decompress(tensor, ctx):
        import horovod.torch as hvd

        return hvd.Compression.fp16.decompress(tensor, ctx)


class Job:
    """The ranks of this job and the transports it can time."""

    def __init__(self):
        self.mpi = None
        if "OMPI_COMM_WORLD_RANK" in os.environ and "HOROVOD_GLOO_RENDEZVOUS_ADDR" not in os.environ:
            # mpi4py first, then Horovod: Horovod then shares the MPI that mpi4py started.
            from mpi4py import MPI

            self.mpi = MPI
        import horovod.torch as hvd
        import torch
        import torch.distributed as dist

        import hvdkit.torch as hk

        self.torch, self.dist, self.hvd = torch, dist, hvd
        hk.init(threads=1)
        self.rank, self.size = hvd.rank(), hvd.size()
        self.controller = "mpi" if hvd.mpi_enabled() and self.mpi is not None else "gloo"
        port = None
        if self.rank == 0:
            with socket.socket() as s:
                s.bind(("", 0))  # free on every address of rank 0's host (MASTER_ADDR may be any of them)
                port = s.getsockname()[1]
        port = hvd.broadcast_object(port, root_rank=0, name="hvdkit.bench.port")
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ["MASTER_PORT"] = str(port)
        dist.init_process_group("gloo", rank=self.rank, world_size=self.size)

    def barrier(self):
        self.dist.barrier()

    def expected_sum(self):
        return self.size * (self.size + 1) / 2

    # --------------------------------------------------------------- variants
    def allreduce_fns(self, nbytes):
        """{variant: (check(), op())}: check runs once on rank-dependent data, op is what is timed."""
        torch, hvd, dist = self.torch, self.hvd, self.dist
        n = nbytes // 4
        fns = {}
        mine = float(self.rank + 1)
        t = torch.full((n,), mine)
        label = f"hvd_{self.controller}"

        def hvd_check(t=t):
            out = hvd.allreduce(t, op=hvd.Sum, name="bench.check")
            return out[[0, n // 2, n - 1]].tolist()

        sweep = torch.zeros(n)
        fns[label] = (hvd_check, lambda z=sweep: hvd.allreduce_(z, op=hvd.Sum, name="bench.sweep"))

        def fp16_check(t=t):
            out = hvd.allreduce(t, op=hvd.Sum, name="bench.check16", compression=RecordingFP16)
            return out[[0, n // 2, n - 1]].tolist()

        sweep16 = torch.zeros(n)

        def fp16_op(z=sweep16):
            # What hvdkit's DistributedOptimizer does per gradient: compress, reduce in place, decompress.
            wire, ctx = RecordingFP16.compress(z)
            hvd.allreduce_(wire, op=hvd.Sum, name="bench.sweep16")
            return RecordingFP16.decompress(wire, ctx)

        fns[f"{label}_fp16"] = (fp16_check, fp16_op)

        def tdist_check(t=t):
            c = t.clone()
            dist.all_reduce(c)
            return c[[0, n // 2, n - 1]].tolist()

        sweep_gloo = torch.zeros(n)
        fns["torch_gloo"] = (tdist_check, lambda z=sweep_gloo: dist.all_reduce(z))
        if self.mpi is not None:
            comm, mpi = self.mpi.COMM_WORLD, self.mpi

            check_src = np.full(n, mine, np.float32)

            def mpi_check(src=check_src):
                dst = np.empty_like(src)
                comm.Allreduce(src, dst, op=mpi.SUM)
                return dst[[0, n // 2, n - 1]].tolist()

            zsrc, zdst = np.zeros(n, np.float32), np.empty(n, np.float32)
            fns["mpi4py"] = (mpi_check, lambda: comm.Allreduce(zsrc, zdst, op=mpi.SUM))
        src, dst = np.full(n, mine, np.float32), np.empty(n, np.float32)

        def copy_check():
            np.copyto(dst, src)
            return dst[[0, n // 2, n - 1]].tolist(), [mine] * 3

        fns["memcpy"] = (copy_check, lambda: np.copyto(dst, src))
        total = [self.expected_sum()] * 3
        return {
            v: (fns[v][0] if v == "memcpy" else (lambda c=check: (c(), total)), op) for v, (check, op) in fns.items()
        }

    def sweep(self, sizes, reps, max_iters=100):
        """(a) and (b): every variant at every size, checked, then timed interleaved."""
        rows = []
        for nbytes in sizes:
            fns = self.allreduce_fns(nbytes)
            checks = {}
            for v, (check, _) in fns.items():
                tol = 1e-2 if v.endswith("fp16") else 0.0
                got, expected = check()
                checks[v] = check_close(f"allreduce {v} {nbytes} B", got, expected, tol)
            RecordingFP16.reset()
            fns[f"hvd_{self.controller}_fp16"][1]()
            wire = RecordingFP16.sent_bytes / RecordingFP16.original_bytes
            samples = {v: Samples() for v in fns}
            iters = iterations_for(nbytes, hi=max_iters)
            for _, v in interleaved(list(fns), reps):
                op = fns[v][1]
                self.barrier()
                op()  # one untimed op lines the ranks up
                samples[v].add(timed(op, iters))
            mem = samples["memcpy"].median
            for v, s in samples.items():
                bw = nbytes / s.median if v == "memcpy" else bus_bandwidth(nbytes, s.median, self.size)
                rows.append(
                    {
                        "bytes": nbytes,
                        "variant": v,
                        "iters": iters,
                        "check_max_abs_diff": checks[v],
                        "bandwidth_Bps": bw,
                        "fraction_of_memcpy": bw / (nbytes / mem),
                        **s.as_dict(),
                    }
                )
            rows.append({"bytes": nbytes, "variant": "fp16_wire_ratio", "value": wire})
            self.progress(f"sweep {nbytes >> 10} KiB done")
        return rows

    def fusion(self, reps, count=FUSION_TENSORS, elements=FUSION_ELEMENTS):
        """(c) ``count`` small tensors one at a time, all at once (fused), grouped, and as one tensor."""
        torch, hvd = self.torch, self.hvd
        mine = float(self.rank + 1)
        small = [torch.full((elements,), mine) for _ in range(count)]
        big = torch.full((count * elements,), mine)

        def unfused(ts):
            for i, t in enumerate(ts):
                hvd.allreduce_(t, op=hvd.Sum, name=f"bench.unfused.{i}")

        def fused(ts):
            handles = [hvd.allreduce_async_(t, op=hvd.Sum, name=f"bench.fused.{i}") for i, t in enumerate(ts)]
            for h in handles:
                hvd.synchronize(h)

        def grouped(ts):
            hvd.grouped_allreduce_(ts, op=hvd.Sum, name="bench.grouped")

        def one(ts):
            hvd.allreduce_(ts[0], op=hvd.Sum, name="bench.one")

        variants = {
            "unfused": (unfused, small),
            "fused": (fused, small),
            "grouped": (grouped, small),
            "one_tensor": (one, [big]),
        }
        checks = {}
        for v, (fn, ts) in variants.items():
            data = [t.clone() for t in ts]
            fn(data)
            got = [float(t[0]) for t in data] + [float(t[-1]) for t in data]
            checks[v] = check_close(f"fusion {v}", got, [self.expected_sum()] * len(got), 0.0)
        zeros = {v: [torch.zeros_like(t) for t in ts] for v, (_, ts) in variants.items()}
        samples = {v: Samples() for v in variants}
        for _, v in interleaved(list(variants), reps):
            fn = variants[v][0]
            self.barrier()
            fn(zeros[v])
            samples[v].add(timed(lambda fn=fn, z=zeros[v]: fn(z), 5))
        return {
            "tensors": count,
            "bytes_each": elements * 4,
            "variants": {v: {**s.as_dict(), "check_max_abs_diff": checks[v]} for v, s in samples.items()},
        }

    def progress(self, msg):
        if self.rank == 0:
            print(f"[bench {self.controller}] {msg}", file=sys.stderr, flush=True)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out")
    p.add_argument("--quick", action="store_true", help="tiny sizes, 1 repetition: checks, not figures")
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--sizes", type=int, nargs="+", help="allreduce sizes in bytes (default: 4 KB ... 64 MB)")
    p.add_argument("--max-iters", type=int, default=100, help="at most this many back-to-back allreduces per sample")
    args = p.parse_args(argv)
    job = Job()
    reps = 1 if args.quick else args.reps
    result = {
        "controller": job.controller,
        "size": job.size,
        "reps": reps,
        "sweep": job.sweep(args.sizes or (QUICK_SIZES if args.quick else SIZES), reps, args.max_iters),
        "fusion": job.fusion(reps, elements=256 if args.quick else FUSION_ELEMENTS),
    }
    job.dist.destroy_process_group()
    if job.rank == 0:
        with open(args.out, "w", encoding="utf-8") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
