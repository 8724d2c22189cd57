"""GPU benchmark: hvdkit/Horovod-NCCL against torch DDP-NCCL on one model, and allreduce bus bandwidth.

    python -m benchmarks.gpu_bench OUT_DIR [--np 1,2] [--batch 64] [--steps 30] [--reps 2]

Run from the repository root (``benchmarks`` is not installed; ``scripts/gpu-proof.sh`` runs it).

Runs, on this machine's GPUs, real jobs of a ResNet-50-sized convolutional network written in plain
torch (25.6 M parameters, 224x224 synthetic images, bf16 autocast, SGD with momentum):
``hk.DistributedOptimizer`` under ``horovodrun --gloo`` and ``DistributedDataParallel`` under
``torch.distributed.run``, alternated (H D H D ...) for each rank count, so the ratio of their
median step times is measured side by side. Then Horovod's allreduce of CUDA tensors from 1 MiB to
256 MiB (bus bandwidth, ``hvdkit.bench.stats.bus_bandwidth``) next to the GPU's own device-to-device
copy rate. Writes OUT_DIR/gpu_bench.json, OUT_DIR/gpu_bench.png and prints a table. Where ranks
outnumber GPUs they share them (``hvdkit.core.devices.shared_gpu_env``: before NCCL 2.30 over
sockets on loopback), which the JSON and the table say: such figures measure that transport, not
NVLink.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence

from hvdkit.bench.jobs import gpu_job_env
from hvdkit.bench.step_models import resnet50

from . import env_with_root

__all__ = ["table", "plot", "report", "main"]

MB = 1 << 20
ALLREDUCE_MIB = (1, 4, 16, 64, 256)


def _iters(mb):
    return max(3, min(20, 512 // mb))


# ---- workers (one process per rank) ----------------------------------------------------------------


def _per_rank_hostid(rank):
    if os.environ.get("HVDKIT_PER_RANK_HOSTID") == "1":  # set before this rank's first NCCL call
        os.environ["NCCL_HOSTID"] = f"hvdkit-rank-{rank}"


def _train_steps(model, opt, batch, steps, warmup, sync):
    import torch

    x = torch.randn(batch, 3, 224, 224, device="cuda")
    y = torch.randint(0, 1000, (batch,), device="cuda")
    loss_fn = torch.nn.CrossEntropyLoss()
    times = []
    for i in range(warmup + steps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        sync()
        torch.cuda.synchronize()
        if i >= warmup:
            times.append(time.perf_counter() - t0)
    return times


def worker_horovod(args):
    import torch

    import hvdkit.torch as hk

    topo = hk.init()
    _per_rank_hostid(topo.rank)
    model = resnet50().to(hk.device())
    hk.broadcast_state(model)
    opt = hk.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9), model=model)
    times = _train_steps(model, opt, args.batch, args.steps, args.warmup, lambda: None)
    _write(args, topo.rank, {"step_s": times})


def _ddp_init():
    """A torch.distributed.run rank: its host id where ranks share GPUs, its GPU, NCCL; its rank."""
    import torch
    import torch.distributed as dist

    rank, local = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"])
    _per_rank_hostid(rank)
    torch.cuda.set_device(local % torch.cuda.device_count())
    dist.init_process_group("nccl")
    return rank


def worker_ddp(args):
    import torch
    import torch.distributed as dist

    rank = _ddp_init()
    model = resnet50().cuda()
    ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=[torch.cuda.current_device()])
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01, momentum=0.9)
    times = _train_steps(ddp, opt, args.batch, args.steps, args.warmup, lambda: None)
    _write(args, rank, {"step_s": times})
    dist.destroy_process_group()


def worker_allreduce(args):
    import horovod.torch as hvd
    import torch

    import hvdkit.torch as hk

    topo = hk.init()
    _per_rank_hostid(topo.rank)
    rows = []
    for mb in ALLREDUCE_MIB:
        n = mb * MB // 4
        t = torch.ones(n, device="cuda")
        hvd.allreduce(t, name=f"warm{mb}", op=hvd.Sum)
        iters = _iters(mb)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(iters):
            out = hvd.allreduce(t, name=f"ar{mb}", op=hvd.Sum)
        torch.cuda.synchronize()
        seconds = (time.perf_counter() - t0) / iters
        assert float(out[0]) == topo.size, f"allreduce of ones gave {float(out[0])}, not {topo.size}"
        copy_s = None
        if topo.rank == 0:
            dst = torch.empty_like(t)
            dst.copy_(t)
            torch.cuda.synchronize()
            c0 = time.perf_counter()
            for _ in range(iters):
                dst.copy_(t)
            torch.cuda.synchronize()
            copy_s = (time.perf_counter() - c0) / iters
        rows.append({"bytes": mb * MB, "allreduce_s": seconds, "copy_s": copy_s})
    _write(args, topo.rank, {"allreduce": rows})


def worker_allreduce_ddp(args):
    import torch
    import torch.distributed as dist

    rank = _ddp_init()
    size = dist.get_world_size()
    rows = []
    for mb in ALLREDUCE_MIB:
        t = torch.ones(mb * MB // 4, device="cuda")
        dist.all_reduce(t.clone())
        iters = _iters(mb)
        work = [t.clone() for _ in range(iters)]  # each iteration sums fresh ones, as Horovod's out-of-place op
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for w in work:
            dist.all_reduce(w)
        torch.cuda.synchronize()
        seconds = (time.perf_counter() - t0) / iters
        assert float(work[-1][0]) == size, f"all_reduce of ones gave {float(work[-1][0])}, not {size}"
        rows.append({"bytes": mb * MB, "allreduce_s": seconds})
    _write(args, rank, {"allreduce": rows})
    dist.destroy_process_group()


def _write(args, rank, data):
    with open(os.path.join(args.work, f"{args.worker}-rank{rank}.json"), "w") as f:
        json.dump(data, f)


# ---- the driver ----------------------------------------------------------------------------------------


def _run(argv, env, timeout):
    t0 = time.monotonic()
    proc = subprocess.run(
        argv, env=env, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL, start_new_session=True
    )
    if proc.returncode != 0:
        raise RuntimeError(
            f"{' '.join(argv[:6])} ... failed (exit {proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
        )
    return time.monotonic() - t0


def _job(kind, np_, args, work, env):
    me = [
        sys.executable,
        "-m",
        "benchmarks.gpu_bench",
        "--worker",
        kind,
        "--work",
        work,
        "--batch",
        str(args.batch),
        "--steps",
        str(args.steps),
        "--warmup",
        str(args.warmup),
    ]
    if kind in ("ddp", "allreduce_ddp"):
        argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={np_}", *me[1:]]
    else:
        horovodrun = os.path.join(os.path.dirname(sys.executable), "horovodrun")
        argv = [horovodrun, "-np", str(np_), "-H", f"localhost:{np_}", "--gloo", *me]
    seconds = _run(argv, env, args.timeout)
    print(f"[gpu-bench]   ({kind} job on {np_} rank(s): {seconds:.0f} s wall)", flush=True)
    return [json.load(open(os.path.join(work, f"{kind}-rank{r}.json"))) for r in range(np_)]


def _job_env(np_, gpus, nccl):
    env, shared = gpu_job_env(np_, gpus, nccl)
    return env_with_root(env), shared  # the ranks run `python -m benchmarks.gpu_bench`


def _allreduce_rows(np_, horovod, ddp):
    """Per size: the slowest rank's time, bus bandwidth (``2 (n-1) / n`` bytes per byte), the copy rate."""
    factor = 2 * (np_ - 1) / np_ if np_ > 1 else 1.0
    rows = []
    for i, row in enumerate(horovod[0]["allreduce"]):
        seconds = max(r["allreduce"][i]["allreduce_s"] for r in horovod)
        torch_s = max(r["allreduce"][i]["allreduce_s"] for r in ddp) if ddp else None
        rows.append(
            {
                "bytes": row["bytes"],
                "allreduce_s": seconds,
                "bus_bytes_per_s": row["bytes"] / seconds * factor,
                "torch_allreduce_s": torch_s,
                "torch_bus_bytes_per_s": row["bytes"] / torch_s * factor if torch_s else None,
                "copy_bytes_per_s": 2 * row["bytes"] / row["copy_s"],
            }
        )
    return rows


def drive(args):
    """Run the jobs; ``args.out``/gpu_bench.json is rewritten after each one, so a cut-off run keeps its results."""
    import torch

    gpus, nccl = torch.cuda.device_count(), torch.cuda.nccl.version()
    name = torch.cuda.get_device_name(0)
    results = {
        "gpu": name,
        "gpus": gpus,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "nccl": ".".join(map(str, nccl)),
        "batch_per_rank": args.batch,
        "steps": args.steps,
        "warmup": args.warmup,
        "model": "ResNet-50 (plain torch, 25.6 M parameters), 224x224, bf16 autocast",
        "allreduce": None,
        "training": [],
        "complete": False,
    }
    path = os.path.join(args.out, "gpu_bench.json")

    def save():
        with open(path, "w") as f:
            json.dump(results, f, indent=1)

    print(
        f"[gpu-bench] {gpus} x {name}, torch {torch.__version__}, CUDA {torch.version.cuda}, NCCL {results['nccl']}",
        flush=True,
    )
    with tempfile.TemporaryDirectory() as work:
        # The allreduce sweep first: short jobs, and the figure a cut-off run must not lose.
        np_ = max(args.np)
        env, shared = _job_env(np_, gpus, nccl)
        horovod = _job("allreduce", np_, args, work, env)
        ddp = _job("allreduce_ddp", np_, args, work, env) if np_ > 1 else None
        results["allreduce"] = {"np": np_, "shared_gpu": shared, "rows": _allreduce_rows(np_, horovod, ddp)}
        save()
        for row in results["allreduce"]["rows"]:
            theirs = row["torch_bus_bytes_per_s"]
            print(
                f"[gpu-bench] allreduce {row['bytes'] // MB:4d} MiB on {np_} rank(s): Horovod bus "
                f"{row['bus_bytes_per_s'] / 1e9:7.2f} GB/s"
                + (f", torch.distributed {theirs / 1e9:7.2f} GB/s" if theirs else "")
                + f"; device copy {row['copy_bytes_per_s'] / 1e9:7.1f} GB/s (read + write)",
                flush=True,
            )
        for np_ in args.np:
            env, shared = _job_env(np_, gpus, nccl)
            entry = {"np": np_, "shared_gpu": shared, "horovod_step_s": [], "ddp_step_s": []}
            results["training"].append(entry)
            for rep in range(args.reps):
                for kind in ("horovod", "ddp"):
                    ranks = _job(kind, np_, args, work, env)
                    step = statistics.median(max(r["step_s"][i] for r in ranks) for i in range(args.steps))
                    entry[f"{kind}_step_s"].append(step)
                    if entry["horovod_step_s"] and entry["ddp_step_s"]:
                        h, d = statistics.median(entry["horovod_step_s"]), statistics.median(entry["ddp_step_s"])
                        entry.update(
                            horovod_img_s=np_ * args.batch / h,
                            ddp_img_s=np_ * args.batch / d,
                            ratio_horovod_over_ddp=d / h,
                        )
                    save()
                    print(
                        f"[gpu-bench] np={np_} rep {rep + 1}/{args.reps} {kind:7s}: {step * 1e3:.1f} ms/step, "
                        f"{np_ * args.batch / step:.0f} img/s",
                        flush=True,
                    )
    results["complete"] = True
    save()
    return results


def _done(results):
    """The training entries with both kinds measured (a cut-off run may have fewer)."""
    return [t for t in results["training"] if "ratio_horovod_over_ddp" in t]


def table(results: dict) -> str:
    """A Markdown table of ``results`` (gpu_bench.json), partial results included."""
    lines = [
        f"GPU: {results['gpus']} x {results['gpu']} "
        f"(torch {results['torch']}, CUDA {results['cuda']}, NCCL {results['nccl']})"
        + ("" if results.get("complete", True) else " -- cut off: partial results"),
        f"{results['model']}, batch {results['batch_per_rank']} per rank",
        "| ranks | GPU shared | hvdkit/Horovod ms/step | DDP ms/step | hvdkit/Horovod img/s | DDP img/s "
        "| Horovod / DDP throughput |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for t in _done(results):
        ms = lambda xs: ", ".join(f"{x * 1e3:.1f}" for x in xs)  # noqa: E731 - local formatter
        lines.append(
            f"| {t['np']} | {'yes' if t['shared_gpu'] else 'no'} | {ms(t['horovod_step_s'])} | {ms(t['ddp_step_s'])} "
            f"| {t['horovod_img_s']:.0f} | {t['ddp_img_s']:.0f} | {t['ratio_horovod_over_ddp']:.2f} |"
        )
    a = results["allreduce"]
    if a:
        lines += [
            "",
            f"Allreduce of CUDA tensors, {a['np']} rank(s){' sharing one GPU' if a['shared_gpu'] else ''}:",
            "| size | Horovod bus GB/s | torch.distributed bus GB/s | Horovod / torch | device copy GB/s "
            "| Horovod bus / copy |",
            "| --- | --- | --- | --- | --- | --- |",
        ]
        for r in a["rows"]:
            theirs = r.get("torch_bus_bytes_per_s")
            lines.append(
                f"| {r['bytes'] // MB} MiB | {r['bus_bytes_per_s'] / 1e9:.2f} | "
                + (f"{theirs / 1e9:.2f} | {r['bus_bytes_per_s'] / theirs:.2f}" if theirs else "- | -")
                + f" | {r['copy_bytes_per_s'] / 1e9:.1f} | {r['bus_bytes_per_s'] / r['copy_bytes_per_s']:.4f} |"
            )
    return "\n".join(lines)


def plot(results: dict, path: str) -> str:
    """Training throughput (left) and allreduce bandwidth against the copy rate (right) as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from hvdkit.bench.report import save_figure

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.2))
    done = _done(results)
    xs = range(len(done))
    ax1.bar([x - 0.2 for x in xs], [t["horovod_img_s"] for t in done], 0.4, label="hvdkit/Horovod-NCCL")
    ax1.bar([x + 0.2 for x in xs], [t["ddp_img_s"] for t in done], 0.4, label="torch DDP-NCCL")
    ax1.set_xticks(list(xs), [f"{t['np']} rank(s){' (shared GPU)' if t['shared_gpu'] else ''}" for t in done])
    ax1.set_ylabel("images/s")
    ax1.set_title(f"ResNet-50 training, {results['gpu']}")
    ax1.legend()
    if results["allreduce"]:
        rows = results["allreduce"]["rows"]
        mib = [r["bytes"] / MB for r in rows]
        ax2.loglog(mib, [r["bus_bytes_per_s"] / 1e9 for r in rows], "o-", label="Horovod allreduce (bus)")
        if all(r.get("torch_bus_bytes_per_s") for r in rows):
            ax2.loglog(mib, [r["torch_bus_bytes_per_s"] / 1e9 for r in rows], "^-", label="torch.distributed (bus)")
        ax2.loglog(mib, [r["copy_bytes_per_s"] / 1e9 for r in rows], "s--", label="device-to-device copy")
        shared = " (ranks share the GPU)" if results["allreduce"]["shared_gpu"] else ""
        ax2.set_title(f"Allreduce on {results['allreduce']['np']} rank(s){shared} vs the copy rate")
    ax2.set_xlabel("MiB")
    ax2.set_ylabel("GB/s")
    ax2.legend()
    return save_figure(fig, path)


def report(json_path: str) -> int:
    """Print the table of a gpu_bench.json and draw gpu_bench.png beside it (also for a cut-off run's file)."""
    try:
        with open(json_path) as f:
            results = json.load(f)
    except (OSError, ValueError) as e:
        print(f"[gpu-bench] cannot read {json_path}: {e}; give the gpu_bench.json a run wrote", file=sys.stderr)
        return 2
    print(table(results))
    try:
        print(f"[gpu-bench] plot: {plot(results, os.path.join(os.path.dirname(json_path) or '.', 'gpu_bench.png'))}")
    except ImportError as e:
        print(f"[gpu-bench] no plot: {e}")
    return 0


WORKERS = {
    "horovod": worker_horovod,
    "ddp": worker_ddp,
    "allreduce": worker_allreduce,
    "allreduce_ddp": worker_allreduce_ddp,
}


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out", nargs="?", help="folder for gpu_bench.json and gpu_bench.png")
    p.add_argument("--np", default="1,2", help="rank counts, comma-separated (default 1,2)")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--warmup", type=int, default=8)
    p.add_argument("--reps", type=int, default=2)
    p.add_argument("--timeout", type=int, default=300)
    p.add_argument("--report", metavar="JSON", help="only print the table and draw the plot of a gpu_bench.json")
    p.add_argument("--worker", choices=sorted(WORKERS), help=argparse.SUPPRESS)
    p.add_argument("--work", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        WORKERS[args.worker](args)
        return 0
    if args.report:
        return report(args.report)
    if not args.out:
        p.error("give OUT_DIR (or --report JSON)")
    args.np = [int(n) for n in args.np.split(",")]
    os.makedirs(args.out, exist_ok=True)
    drive(args)
    return report(os.path.join(args.out, "gpu_bench.json"))


if __name__ == "__main__":
    sys.exit(main())
