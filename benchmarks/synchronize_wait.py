"""``python -m benchmarks synchronize-wait``: how a torch rank waits in ``synchronize()``, before and after engine
fix 80.

    python -m benchmarks synchronize-wait --before-wheel WHEEL --out docs/bench/synchronize-wait-DATE [--reps 3]
        [--windows 0,5000]

Before engine fix 80 (hvdkit/engine/recipe/horovod-fixes/80-torch-synchronize-waits-without-spinning.patch) a rank
waiting for a handle polled it with ``yield()`` and took the GIL back at every turn; with the fix it polls for a
window (``HOROVOD_TORCH_WAIT_POLL_US``), then sleeps until the operation is done. ``--before-wheel`` is an engine
wheel without the fix (the one ``make setup`` built for the fix level before it, in ``~/.cache/hvdkit/wheels/``):
its ``horovod`` package is unpacked and put first on the ranks' ``PYTHONPATH`` for the "yield" jobs; the other
ways run the installed engine with each window of ``--windows`` (microseconds). Each job says which fix level it
ran and whether fix 80 was in it. Interleaved (yield, each window, yield, ...), each a fresh ``mpirun -np 2`` job,
measuring on each rank:

- ``wait``: rank 0 sleeps ``WAIT_S`` before an allreduce that rank 1 has already called; rank 1's main thread's
  share of the wait on a CPU, and its process's CPU seconds per second (Horovod's background thread too);
- ``allreduce``: the median time of one allreduce of a 1-float tensor (a sleeping wait could lengthen it);
- ``step``: the median step of an MLP (784-1024-1024-10, batch 64) through ``hk.DistributedOptimizer``, the
  ranks' weights checked equal after.

Writes OUT/synchronize-wait.json (every job, the machine, the load), OUT/synchronize-wait.png and prints the table:
for each measure the median over the jobs of each way, and each window's / yield's.
"""

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time
import zipfile

from benchmarks import plot_ways, write_record
from benchmarks.controller_wait import allreduce_latency, mlp_steps, two_rank_job

__all__ = ["main"]

BEFORE = "yield"
WINDOW_ENV = "HOROVOD_TORCH_WAIT_POLL_US"
FIX = "80-torch-synchronize-waits-without-spinning"
WAIT_S = 2.0
MEASURES = (
    ("wait_main_thread_share", "waiting rank: its main thread on a CPU, share of the wait", "{:.3f}"),
    ("wait_cpu_per_s", "waiting rank: CPU s per s (every thread)", "{:.3f}"),
    ("allreduce_us", "allreduce of 1 float, median", "{:.0f} us"),
    ("step_ms", "MLP step, median (rank 0)", "{:.2f} ms"),
)


def _main_thread_on_cpu_s():
    with open(f"/proc/self/task/{threading.get_native_id()}/schedstat") as f:
        return int(f.read().split()[0]) / 1e9


def worker(out, quick):
    """One rank of one job: the measures into ``out`` (rank 0 writes the ranks' values)."""
    import horovod.torch as hvd
    import torch
    from horovod import hvdkit_fixes

    import hvdkit.torch as hk

    hk.init()
    rank = hvd.rank()
    for _ in range(20):
        hvd.allreduce(torch.ones(1), name="sw.warm")
    if rank == 0:
        time.sleep(0.5 if quick else WAIT_S)
    main0, cpu0, t0 = _main_thread_on_cpu_s(), time.process_time(), time.perf_counter()
    hvd.allreduce(torch.ones(1024), name="sw.late")
    wall = time.perf_counter() - t0
    wait = {"wait_s": wall, "wait_main_thread_share": (_main_thread_on_cpu_s() - main0) / wall}
    wait["wait_cpu_per_s"] = (time.process_time() - cpu0) / wall
    allreduce_us, _ = allreduce_latency(50 if quick else 1000)
    step_ms, weights_equal = mlp_steps(5 if quick else 60)
    mine = {
        **wait,
        "allreduce_us": allreduce_us,
        "step_ms": step_ms,
        "weights_equal": weights_equal,
        "fix_level": hvdkit_fixes.LEVEL,
        "has_fix": any(name.startswith(FIX) for name in hvdkit_fixes.FIXES),
    }
    ranks = hvd.allgather_object(mine, name="sw.result")
    if rank == 0:
        with open(out, "w", encoding="utf-8") as f:
            json.dump(ranks, f)
    hvd.shutdown()


def way_name(window_us):
    return f"poll {window_us} us"


def _job(way, out, quick, mpirun, before_path, window_us=None):
    env = {k: v for k, v in os.environ.items() if k != WINDOW_ENV}
    if window_us is not None:
        env[WINDOW_ENV] = str(window_us)
    if way == BEFORE:  # the engine before the fix first on the ranks' path
        env["PYTHONPATH"] = os.pathsep.join(p for p in (before_path, env.get("PYTHONPATH", "")) if p)
    exported = [WINDOW_ENV] if window_us is not None else []
    ranks = two_rank_job("synchronize-wait", "benchmarks.synchronize_wait", way, out, quick, mpirun, env, exported)
    if any(r["has_fix"] != (way != BEFORE) for r in ranks):
        raise SystemExit(f"synchronize-wait: the {way} job ran the engine of fix level {ranks[0]['fix_level']}")
    waiting = ranks[1]  # rank 0 came late
    return {
        "way": way,
        "fix_level": ranks[0]["fix_level"],
        "wait_s": waiting["wait_s"],
        "wait_main_thread_share": waiting["wait_main_thread_share"],
        "wait_cpu_per_s": waiting["wait_cpu_per_s"],
        "allreduce_us": ranks[0]["allreduce_us"],
        "step_ms": ranks[0]["step_ms"],
    }


def ways_of(jobs):
    """The ways in ``jobs``, in the order they first ran (yield first)."""
    return list(dict.fromkeys(j["way"] for j in jobs))


def summarize(jobs):
    """Per measure: each way's median over its jobs, and each way's over yield's (``over_yield``)."""
    table = {}
    for key, _, _ in MEASURES:
        med = {w: statistics.median(j[key] for j in jobs if j["way"] == w) for w in ways_of(jobs)}
        base = med.get(BEFORE)
        table[key] = {**med, "over_yield": {w: (v / base if base else None) for w, v in med.items() if w != BEFORE}}
    return table


def table_lines(table):
    ways = [w for w in table[MEASURES[0][0]] if w != "over_yield"]
    after = [w for w in ways if w != BEFORE]
    head = ["measure", "yield (before)", *(f"{w} (fix 80)" for w in after), *(f"{w} / yield" for w in after)]
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for key, label, fmt in MEASURES:
        row = table[key]
        values = [fmt.format(row[w]) for w in ways]
        ratios = ["" if row["over_yield"][w] is None else f"{row['over_yield'][w]:.2f}x" for w in after]
        lines.append("| " + " | ".join([label, *values, *ratios]) + " |")
    return lines


def plot(jobs, path):
    keys = [
        ("wait_cpu_per_s", "waiting rank: CPU s per s"),
        ("allreduce_us", "allreduce of 1 float (us)"),
        ("step_ms", "MLP step (ms)"),
    ]
    ways = ways_of(jobs)
    labels = [w if w == BEFORE else f"{w}\n(fix 80)" for w in ways]
    title = "A torch rank waiting in synchronize() (each dot a 2-rank job; line: median)"
    plot_ways(jobs, ways, labels, keys, title, path)


def _unpack(wheel, into):
    """The wheel's files under ``into`` (a folder to put first on PYTHONPATH)."""
    with zipfile.ZipFile(wheel) as z:
        z.extractall(into)
    return into


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m benchmarks synchronize-wait", description=__doc__.splitlines()[0])
    p.add_argument("--out", help="folder for synchronize-wait.json and synchronize-wait.png")
    p.add_argument("--before-wheel", help="an engine wheel without fix 80 (~/.cache/hvdkit/wheels/...)")
    p.add_argument("--reps", type=int, default=3, help="jobs of each way, interleaved (default: 3)")
    p.add_argument("--windows", default="0,5000", help="poll windows (us) for the fixed engine (5000: its default)")
    p.add_argument("--quick", action="store_true", help="short jobs, once: checks the benchmark, measures nothing")
    p.add_argument("--worker", metavar="OUT", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        worker(args.worker, args.quick)
        return 0
    if not args.out or not args.before_wheel:
        p.error("--out and --before-wheel are required")
    if not os.path.isfile(args.before_wheel):
        p.error(f"--before-wheel {args.before_wheel!r} is not a file (make setup keeps them in ~/.cache/hvdkit/wheels)")
    if args.reps < 1:
        p.error(f"--reps must be at least 1 (got {args.reps})")
    try:
        windows = [int(w) for w in args.windows.split(",")]
    except ValueError:
        windows = [-1]
    if not windows or min(windows) < 0:
        p.error(f"--windows must be microseconds >= 0, comma-separated (got {args.windows!r})")
    from hvdkit.bench.jobs import machine, say
    from hvdkit.launcher.plan import find_tool

    os.makedirs(args.out, exist_ok=True)
    mpirun = find_tool("mpirun", sys.executable)
    m, t0, jobs = machine(), time.perf_counter(), []
    reps = 1 if args.quick else args.reps
    with tempfile.TemporaryDirectory(prefix="synchronize-wait-") as tmp:
        before_path = _unpack(args.before_wheel, os.path.join(tmp, "before"))
        plan = [(BEFORE, None)] + [(way_name(w), w) for w in windows]
        for rep in range(reps):
            for way, window in plan:
                say(f"synchronize-wait: job {len(jobs) + 1} of {reps * len(plan)} ({way})")
                out = os.path.join(tmp, f"job-{rep}-{len(jobs)}.json")
                jobs.append(_job(way, out, args.quick, mpirun, before_path, window))
    table = summarize(jobs)
    result = {
        "jobs": jobs,
        "table": table,
        "before_wheel": os.path.basename(os.path.dirname(os.path.abspath(args.before_wheel))),
        "machine": m,
        "load_average_at_end": os.getloadavg(),
        "quick": args.quick,
        "seconds": time.perf_counter() - t0,
    }
    data, png = write_record(args.out, "synchronize-wait", result, table_lines(table), plot, jobs)
    say(f"synchronize-wait: done in {result['seconds']:.0f} s: {data}, {png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
