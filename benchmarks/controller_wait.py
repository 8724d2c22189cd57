"""``python -m benchmarks controller-wait``: how Horovod's MPI controller waits, ``sleep`` (engine fix 20) vs ``spin``.

    python -m benchmarks controller-wait --out docs/bench/controller-wait-DATE [--reps 3] [--quick]

Before engine fix 20 (hvdkit/engine/recipe/horovod-fixes/20-common-mpi-controller-waits-without-spinning.patch) the
coordinator waited for the other ranks in Open MPI's blocking collectives, which poll without pause;
``HOROVOD_MPI_CONTROLLER_WAIT=spin`` brings that wait back, so both run on the same engine, interleaved (spin,
sleep, spin, ...), each a fresh ``mpirun -np 2`` job. Every job measures on each rank:

- ``idle``: the process's CPU seconds per second while both ranks sleep (Horovod started, nothing queued);
- ``allreduce``: the median time of one allreduce of a 1-float tensor (the controller's latency, which a
  sleeping wait could lengthen), and the CPU per second meanwhile;
- ``step``: the median step of an MLP (784-1024-1024-10, batch 64) through ``hk.DistributedOptimizer``, torch on
  the threads hvdkit gives a rank, and the ranks' weights checked equal after the steps.

Writes OUT/controller-wait.json (every job, the machine, the load), OUT/controller-wait.png and prints the
table: for each measure the median over the jobs of each way, and sleep / spin.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

from benchmarks import plot_ways, write_record

__all__ = ["main"]

WAYS = ("spin", "sleep")
MEASURES = (  # the rank that polls differs from job to job: the two ranks' sum and the busier one
    ("idle_cpu_per_s_both", "idle: CPU s per s, both ranks", "{:.3f}"),
    ("idle_cpu_per_s_busier", "idle: CPU s per s, the busier rank", "{:.3f}"),
    ("allreduce_us", "allreduce of 1 float, median", "{:.0f} us"),
    ("allreduce_cpu_per_s", "during the allreduces: CPU s per s, rank 0", "{:.2f}"),
    ("step_ms", "MLP step, median (rank 0)", "{:.2f} ms"),
)


def _cpu():
    return time.process_time()


def allreduce_latency(n):
    """In a started job: (median us of ``n`` allreduces of one float, this process's CPU s per s meanwhile)."""
    import horovod.torch as hvd
    import torch

    one, times = torch.ones(1), []
    c0, t0 = _cpu(), time.perf_counter()
    for _ in range(n):
        s = time.perf_counter()
        hvd.allreduce(one, name="cw.one")
        times.append(time.perf_counter() - s)
    return statistics.median(times) * 1e6, (_cpu() - c0) / (time.perf_counter() - t0)


def mlp_steps(n):
    """In a started job: (median ms of ``n`` steps of a 784-1024-1024-10 MLP, batch 64, through
    ``hk.DistributedOptimizer``, the first 2 left out; whether every rank ended with the same weights)."""
    import horovod.torch as hvd
    import torch

    import hvdkit.torch as hk

    torch.manual_seed(0)
    nn = torch.nn
    model = nn.Sequential(nn.Linear(784, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 10))
    opt = hk.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01), model=model)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    gen = torch.Generator().manual_seed(1 + hvd.rank())
    x, y = torch.randn(64, 784, generator=gen), torch.randint(0, 10, (64,), generator=gen)
    steps = []
    for i in range(n):
        s = time.perf_counter()
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        if i >= 2:
            steps.append(time.perf_counter() - s)
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    weights = hvd.allgather_object(flat.numpy().tobytes(), name="cw.weights")
    return statistics.median(steps) * 1e3, all(w == weights[0] for w in weights)


def worker(out, quick):
    """One rank of one job: the three measures into ``out`` (rank 0 writes the ranks' values)."""
    import horovod.torch as hvd
    import torch

    import hvdkit.torch as hk

    hk.init()
    rank = hvd.rank()
    one = torch.ones(1)
    for _ in range(20):  # both ranks past their start, the response cache warm
        hvd.allreduce(one, name="cw.warm")
    idle_s = 1.0 if quick else 3.0
    c0, t0 = _cpu(), time.perf_counter()
    time.sleep(idle_s)
    idle = (_cpu() - c0) / (time.perf_counter() - t0)

    allreduce_us, allreduce_cpu = allreduce_latency(50 if quick else 1000)
    step_ms, weights_equal = mlp_steps(5 if quick else 60)
    mine = {
        "idle_cpu_per_s": idle,
        "allreduce_us": allreduce_us,
        "allreduce_cpu_per_s": allreduce_cpu,
        "step_ms": step_ms,
        "torch_threads": torch.get_num_threads(),
        "weights_equal": weights_equal,
    }
    ranks = hvd.allgather_object(mine, name="cw.result")
    if rank == 0:
        with open(out, "w", encoding="utf-8") as f:
            json.dump(ranks, f)
    hvd.shutdown()


def two_rank_job(bench, module, way, out, quick, mpirun, env, exported=()):
    """``python -m module --worker out`` on 2 ranks under ``mpirun`` with ``env`` (``exported`` variables and
    PYTHONPATH passed on to the ranks, the repository first on it): every rank's record, their weights checked equal.
    ``bench`` names the benchmark in the errors (exit with the job's output)."""
    env = dict(env)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (os.getcwd(), env.get("PYTHONPATH", "")) if p)
    argv = [mpirun, "-np", "2", "--bind-to", "none", "-x", "PYTHONPATH"]
    for name in exported:
        argv += ["-x", name]
    if os.geteuid() == 0:
        argv.append("--allow-run-as-root")
    argv += [sys.executable, "-m", module, "--worker", out] + (["--quick"] if quick else [])
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        tail = f"{done.stdout[-3000:]}{done.stderr[-3000:]}"
        raise SystemExit(f"{bench}: the {way} job failed (exit {done.returncode}):\n{tail}")
    with open(out, encoding="utf-8") as f:
        ranks = json.load(f)
    if not all(r["weights_equal"] for r in ranks):
        raise SystemExit(f"{bench}: the {way} job's ranks ended with different weights")
    return ranks


def _job(way, out, quick, mpirun):
    env = {**os.environ, "HOROVOD_MPI_CONTROLLER_WAIT": way}
    ranks = two_rank_job(
        "controller-wait", "benchmarks.controller_wait", way, out, quick, mpirun, env, ["HOROVOD_MPI_CONTROLLER_WAIT"]
    )
    row = dict(ranks[0])
    row["idle_cpu_per_s_rank1"] = ranks[1]["idle_cpu_per_s"]
    row["way"] = way
    return with_idle_totals(row)


def with_idle_totals(row):
    """``row`` (a job) with the idle CPU of both ranks summed and of the busier one."""
    idle = (row["idle_cpu_per_s"], row["idle_cpu_per_s_rank1"])
    return {**row, "idle_cpu_per_s_both": sum(idle), "idle_cpu_per_s_busier": max(idle)}


def summarize(jobs):
    """Per measure: each way's median over its jobs and sleep / spin."""
    table = {}
    for key, _, _ in MEASURES:
        med = {w: statistics.median(j[key] for j in jobs if j["way"] == w) for w in WAYS}
        table[key] = {**med, "sleep_over_spin": med["sleep"] / med["spin"] if med["spin"] else None}
    return table


def table_lines(table):
    lines = ["| measure | spin (before) | sleep (fix 20) | sleep / spin |", "| --- | --- | --- | --- |"]
    for key, label, fmt in MEASURES:
        row = table[key]
        ratio = "" if row["sleep_over_spin"] is None else f"{row['sleep_over_spin']:.2f}x"
        lines.append(f"| {label} | {fmt.format(row['spin'])} | {fmt.format(row['sleep'])} | {ratio} |")
    return lines


def plot(jobs, path):
    keys = [
        ("idle_cpu_per_s_both", "idle: both ranks' CPU s/s"),
        ("allreduce_us", "allreduce of 1 float (us)"),
        ("step_ms", "MLP step (ms)"),
    ]
    title = "Horovod's MPI controller: how it waits (each dot a 2-rank job; line: median)"
    plot_ways(jobs, WAYS, ["spin (before)", "sleep (fix 20)"], keys, title, path)


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m benchmarks controller-wait", description=__doc__.splitlines()[0])
    p.add_argument("--out", help="folder for controller-wait.json and controller-wait.png")
    p.add_argument("--reps", type=int, default=3, help="jobs of each way, interleaved (default: 3)")
    p.add_argument("--quick", action="store_true", help="short jobs, once: checks the benchmark, measures nothing")
    p.add_argument("--worker", metavar="OUT", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        worker(args.worker, args.quick)
        return 0
    if not args.out:
        p.error("--out is required")
    if args.reps < 1:
        p.error(f"--reps must be at least 1 (got {args.reps})")
    from hvdkit.bench.jobs import machine, say
    from hvdkit.launcher.plan import find_tool

    os.makedirs(args.out, exist_ok=True)
    mpirun = find_tool("mpirun", sys.executable)
    m, t0, jobs = machine(), time.perf_counter(), []
    reps = 1 if args.quick else args.reps
    for rep in range(reps):
        for way in WAYS:
            say(f"controller-wait: job {len(jobs) + 1} of {reps * len(WAYS)} ({way})")
            jobs.append(_job(way, os.path.join(args.out, f"job-{rep}-{way}.json"), args.quick, mpirun))
    table = summarize(jobs)
    result = {
        "jobs": jobs,
        "table": table,
        "machine": m,
        "load_average_at_end": os.getloadavg(),
        "quick": args.quick,
        "seconds": time.perf_counter() - t0,
    }
    for rep in range(reps):
        for way in WAYS:
            os.remove(os.path.join(args.out, f"job-{rep}-{way}.json"))
    data, png = write_record(args.out, "controller-wait", result, table_lines(table), plot, jobs)
    say(f"controller-wait: done in {result['seconds']:.0f} s: {data}, {png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
