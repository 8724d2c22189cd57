"""Benchmark worker: where a training step's time goes, for hvdkit/Horovod and for DDP on one model.

    horovodrun -np 2 --gloo python -m hvdkit.bench.breakdown OUT.json [--device cuda] [--models resnet50,bert]

(``hvdkit.bench.step_sweep`` starts it, ``hvdkit bench --breakdown`` on CPU.) In one job, on the
same ranks and batches, each model is trained by the variants ``ddp`` (DistributedDataParallel,
gloo on CPU, NCCL on GPU), ``hvdkit`` (``hk.DistributedOptimizer``: Horovod's hooks and fusion) and
``hvdkit_bucket`` (the same with ``bucket_mb=``), interleaved. Every step is cut at its boundaries:
step start, forward start (after ``zero_grad``), forward end (loss computed), last gradient
produced (a post-accumulate-grad hook on the parameter whose gradient came last in warm-up),
``backward()`` returned, gradients averaged (Horovod: ``synchronize()`` returned; DDP: averaged
when ``backward()`` returns) and optimizer step done. The phases (``PHASES``) are the intervals:

- ``forward``; ``backward`` (compute, to the last gradient, with whatever communication overlaps it);
- ``exposed_comm``: from the last gradient to the averaged gradients (what communication adds
  after backward; Horovod: to ``synchronize()``; DDP: to ``backward()`` returning);
- ``optimizer``; ``host``: the rest of the wall-clock step (``zero_grad``, and on GPU the host's
  launch and wait time around the device work).

On GPU the boundaries are CUDA events on the compute stream (``torch.cuda.Event(enable_timing=True)``)
and ``host`` is the wall-clock step minus the events' span; on CPU they are ``time.perf_counter``.
``hidden_comm`` is an estimate, not a phase: the time the same gradients take to average alone
(``comm_alone_s``, measured after training: one grouped Horovod allreduce; for DDP,
``torch.distributed`` allreduces of 25 MiB buckets) minus ``exposed_comm``, bounded by ``backward``.
Rank 0 writes OUT.json.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import time
from collections.abc import Sequence
from typing import Any

__all__ = ["PHASES", "VARIANTS", "phases_of", "summarize", "main"]

PHASES = ("forward", "backward", "exposed_comm", "optimizer", "host")
VARIANTS = ("ddp", "hvdkit", "hvdkit_bucket")
MARKS = ("start", "fwd0", "fwd1", "grad", "bwd", "sync", "end")
DDP_BUCKET_MB = 25


def phases_of(marks: dict[str, float], step_s: float | None = None) -> dict[str, float]:
    """One step's phases (seconds) from its boundary times ``marks`` (seconds, one clock; ``MARKS``).

    ``step_s``: the wall-clock step where ``marks`` are device times (GPU): ``host`` is then what
    the device span from forward start to step end leaves of it; without it (CPU) the step is
    ``end - start`` and ``host`` the time before the forward pass. The last gradient can come
    after ``backward()`` returns only by clock jitter; it is taken as at most ``bwd``.
    """
    grad = min(marks["grad"], marks["bwd"])
    out = {
        "forward": marks["fwd1"] - marks["fwd0"],
        "backward": grad - marks["fwd1"],
        "exposed_comm": marks["sync"] - grad,
        "optimizer": marks["end"] - marks["sync"],
    }
    if step_s is None:
        step_s = marks["end"] - marks["start"]
        out["host"] = marks["fwd0"] - marks["start"]
    else:
        out["host"] = max(0.0, step_s - (marks["end"] - marks["fwd0"]))
    return {**{p: max(0.0, out[p]) for p in PHASES}, "step": step_s}


def summarize(steps: Sequence[dict[str, float]], comm_alone_s: float | None) -> dict[str, Any]:
    """Mean phases over ``steps`` (they sum to the mean step), the median step and the hidden-comm estimate."""
    mean = {p: statistics.fmean(s[p] for s in steps) for p in (*PHASES, "step")}
    hidden = None
    if comm_alone_s is not None:
        hidden = min(max(0.0, comm_alone_s - mean["exposed_comm"]), mean["backward"])
    return {
        "phases_mean_s": {p: mean[p] for p in PHASES},
        "step_mean_s": mean["step"],
        "step_median_s": statistics.median(s["step"] for s in steps),
        "comm_alone_s": comm_alone_s,
        "hidden_comm_s": hidden,
    }


class Clock:
    """Marks a step's boundaries: CUDA events on the current stream, or ``perf_counter`` on CPU."""

    def __init__(self, torch: Any, cuda: bool) -> None:
        self.torch, self.cuda = torch, cuda
        self.marks: dict[str, Any] = {}

    def mark(self, name: str) -> None:
        if self.cuda:
            event = self.torch.cuda.Event(enable_timing=True)
            event.record()
            self.marks[name] = event
        else:
            self.marks[name] = time.perf_counter()

    def read(self) -> dict[str, float]:
        """The marks in seconds (after the step's work is done: on GPU it synchronizes)."""
        if not self.cuda:
            return dict(self.marks)
        self.torch.cuda.synchronize()
        start = self.marks["start"]
        return {k: start.elapsed_time(e) / 1e3 for k, e in self.marks.items()}


class Trainer:
    """One variant of one model: its copy of the model, its optimizer, its step with marks."""

    def __init__(self, ctx: Any, spec: Any, variant: str, bucket_mb: float) -> None:
        import torch

        import hvdkit.torch as hk

        self.ctx, self.variant, self.torch = ctx, variant, torch
        torch.manual_seed(0)
        model = spec.build().to(ctx.device)
        self.params = [p for p in model.parameters() if p.requires_grad]
        if variant == "ddp":
            ids = [ctx.device.index] if ctx.cuda else None
            self.model = torch.nn.parallel.DistributedDataParallel(model, device_ids=ids)
            self.opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        else:
            hk.broadcast_state(model)
            self.model = model
            base = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
            self.opt = hk.DistributedOptimizer(
                base, model=model, bucket_mb=bucket_mb if variant == "hvdkit_bucket" else None
            )
        self.clock = Clock(torch, ctx.cuda)
        self.order: list[int] = []
        self.last = None
        self.hooks = [p.register_post_accumulate_grad_hook(self._hook(i)) for i, p in enumerate(self.params)]

    def _hook(self, i):
        def hook(_):
            if self.last is None:
                self.order.append(i)  # warm-up: which gradient comes last
            elif i == self.last:
                self.clock.mark("grad")

        return hook

    def step(self, x: Any, y: Any) -> dict[str, float]:
        torch, clock, cuda = self.torch, self.clock, self.ctx.cuda
        clock.marks = {}
        if cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        clock.mark("start")
        self.opt.zero_grad(set_to_none=True)
        clock.mark("fwd0")
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=cuda):
            loss = torch.nn.functional.cross_entropy(self.model(x), y)
        clock.mark("fwd1")
        loss.backward()
        clock.mark("bwd")
        if self.variant != "ddp":
            self.opt.synchronize()
        clock.mark("sync")
        if self.variant == "ddp":
            self.opt.step()
        else:
            with self.opt.skip_synchronize():
                self.opt.step()
        clock.mark("end")
        marks = clock.read()
        step_s = time.perf_counter() - t0 if cuda else None
        if self.last is None:
            marks["grad"] = marks["bwd"]
        return phases_of(marks, step_s)

    def settle(self) -> None:
        """After warm-up: from now on only the parameter whose gradient came last marks ``grad``."""
        self.last = self.order[-1]

    def checksum(self) -> float:
        return float(sum(p.detach().double().sum() for p in self.params))


def _init(device: str) -> Any:
    """Horovod (hvdkit's settings), then torch.distributed on the same ranks; the job's context."""
    import horovod.torch as hvd
    import torch
    import torch.distributed as dist

    import hvdkit.torch as hk

    cuda = device == "cuda"
    topo = hk.init(threads=None if cuda else 1)
    if os.environ.get("HVDKIT_PER_RANK_HOSTID") == "1":  # ranks sharing a GPU under NCCL < 2.30
        os.environ["NCCL_HOSTID"] = f"hvdkit-rank-{topo.rank}"
    port = None
    if topo.rank == 0:
        with socket.socket() as s:
            s.bind(("", 0))
            port = s.getsockname()[1]
    os.environ["MASTER_PORT"] = str(hvd.broadcast_object(port, root_rank=0, name="hvdkit.breakdown.port"))
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    dist.init_process_group("nccl" if cuda else "gloo", rank=topo.rank, world_size=topo.size)
    ctx = argparse.Namespace(hvd=hvd, dist=dist, torch=torch, rank=topo.rank, size=topo.size, cuda=cuda)
    ctx.device = hk.device() if cuda else torch.device("cpu")
    return ctx


def comm_alone(ctx: Any, params: Sequence[Any], reps: int = 3) -> dict[str, float]:
    """Seconds to average gradients shaped as ``params`` alone: Horovod (one grouped allreduce) and
    ``torch.distributed`` (allreduces of 25 MiB buckets, as DDP's reducer); median of ``reps``."""
    torch, hvd, dist = ctx.torch, ctx.hvd, ctx.dist
    grads = [torch.ones_like(p) for p in params]
    flat = torch.cat([g.reshape(-1) for g in grads])
    chunks = flat.split(DDP_BUCKET_MB * (1 << 20) // flat.element_size())

    def horovod():
        hvd.grouped_allreduce_(grads, name="hvdkit.breakdown.comm", op=hvd.Average)

    def ddp():
        for work in [dist.all_reduce(c, async_op=True) for c in chunks]:
            work.wait()

    out = {}
    for name, fn in (("horovod", horovod), ("ddp", ddp)):
        fn()
        samples = []
        for _ in range(reps):
            dist.barrier()
            if ctx.cuda:
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            fn()
            if ctx.cuda:
                torch.cuda.synchronize()
            samples.append(time.perf_counter() - t0)
        out[name] = statistics.median(samples)
    return out


def run_model(ctx: Any, name: str, args: argparse.Namespace) -> dict[str, Any]:
    """Train ``name`` with every variant, interleaved; each variant's summary (rank 0's and every rank's)."""
    from .step_models import MODELS

    spec = MODELS[name]
    batch = args.batch or spec.default_batch
    x, y = spec.batch(batch, ctx.device, ctx.rank)
    trainers = {v: Trainer(ctx, spec, v, args.bucket_mb) for v in args.variants}
    for t in trainers.values():
        for _ in range(args.warmup):
            t.step(x, y)
        t.settle()
    sums = {v: t.checksum() for v, t in trainers.items()}
    gathered = ctx.hvd.allgather_object(sums, name="hvdkit.breakdown.check")
    steps: dict[str, list[dict[str, float]]] = {v: [] for v in trainers}
    per_rep = max(1, args.steps // args.reps)
    for _ in range(args.reps):
        for v, t in trainers.items():
            ctx.dist.barrier()
            steps[v] += [t.step(x, y) for _ in range(per_rep)]
    alone = comm_alone(ctx, trainers[args.variants[0]].params)
    variants = {}
    for v, t in trainers.items():
        summary = summarize(steps[v], alone["ddp" if v == "ddp" else "horovod"])
        every = ctx.hvd.allgather_object(summary["step_mean_s"], name=f"hvdkit.breakdown.{v}")
        variants[v] = {
            **summary,
            "ranks_step_mean_s": every,
            "steps": steps[v],
            "last_gradient": t.last,
            "across_ranks_abs_diff": max(abs(g[v] - gathered[0][v]) for g in gathered),
            **({"bucket_sizes": t.opt.bucket_sizes} if v == "hvdkit_bucket" else {}),
        }
    params = trainers[args.variants[0]].params
    del trainers
    if ctx.cuda:
        ctx.torch.cuda.empty_cache()
    return {
        "describe": spec.describe,
        "parameters": sum(p.numel() for p in params),
        "gradient_bytes": sum(p.numel() * p.element_size() for p in params),
        "batch_per_rank": batch,
        "comm_alone_s": alone,
        "variants": variants,
    }


def main(argv: Sequence[str] | None = None) -> int:
    """The worker: every model of ``--models``, every variant of ``--variants``; rank 0 writes OUT.json."""
    from hvdkit.core.horovod_settings import HOROVOD_DEFAULTS

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--models", default="mlp", help="comma-separated names of hvdkit.bench.step_models.MODELS")
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--batch", type=int, default=0, help="per rank (default: the model's)")
    p.add_argument("--steps", type=int, default=20, help="timed steps per variant")
    p.add_argument("--warmup", type=int, default=10, help="untimed steps per variant first (at least 1)")
    p.add_argument("--reps", type=int, default=2, help="the timed steps come in this many interleaved runs")
    p.add_argument("--bucket-mb", type=float, default=25.0, help="bucket_mb of the hvdkit_bucket variant")
    args = p.parse_args(argv)
    args.variants = [v for v in args.variants.split(",") if v]
    if args.warmup < 1:
        p.error("--warmup must be at least 1: the warm-up finds the parameter whose gradient comes last")
    t0 = time.perf_counter()
    ctx = _init(args.device)
    result: dict[str, Any] = {
        "device": args.device,
        "gpu": ctx.torch.cuda.get_device_name(ctx.device) if ctx.cuda else None,
        "ranks": ctx.size,
        "steps": args.steps,
        "warmup": args.warmup,
        "horovod_env": {k: os.environ.get(k) for k in (*HOROVOD_DEFAULTS, *SWEPT)},
        "models": {},
    }
    for name in args.models.split(","):
        result["models"][name] = run_model(ctx, name, args)
    result["seconds"] = time.perf_counter() - t0
    ctx.dist.destroy_process_group()
    if ctx.rank == 0:
        with open(args.out, "w", encoding="utf-8") as f:
            json.dump(result, f, indent=1)
    return 0


# The Horovod variables the step sweep changes (recorded as each job's ranks saw them).
SWEPT = (
    "HOROVOD_ENABLE_ASYNC_COMPLETION",
    "HOROVOD_NUM_NCCL_STREAMS",
    "HOROVOD_BATCH_D2D_MEMCOPIES",
    "HOROVOD_TIMELINE",
)

if __name__ == "__main__":
    raise SystemExit(main())
