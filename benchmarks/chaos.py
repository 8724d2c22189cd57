"""``python -m benchmarks chaos``: a Trainer job on 2 ranks under a steady rate of SIGKILLs, per way of recovering.

    python -m benchmarks chaos --minutes 10 --fault-every 30 [--out DIR] [--ways in-process,restart,none]

Each way runs benchmarks/chaos_worker.py (``hk.Trainer``, the digits examples' MLP or ``--model big``
of about 100 MB, global batch 64, a checkpoint every ``--checkpoint-every`` steps) as
``hvdkit run -np 2 -H HOSTS --gloo``, one after the other (``--together``: all at once, so every way
meets the same load on a shared machine and their ratios stay comparable):
  in-process  ``--min-np 1 --max-np 2 --recovery in-process`` (Horovod's elastic driver; the survivors
              go back to the last in-memory commit, every ``--commit-every`` steps, and go on);
  restart     ``--min-np 1 --max-np 2 --max-restarts 100000`` (the job is relaunched and resumes from
              its newest checkpoint);
  none        no faults: the same job at a fixed size, the baseline.
From the first step at 2 ranks, every ``--fault-every`` seconds one rank's process, drawn at random
from the pids the job's ranks log and found among the launcher's descendants (never by name), gets
SIGKILL; its host stays listed, so a new process takes its place. A fault waits until the job trains
at 2 ranks again after the previous one (its delay is recorded). After ``--minutes`` every rank stops
after the same step (``OUT/jobs/<way>/stop``). Recorded per way (OUT/<way>.json): useful throughput
(samples of the schedule per second, counted by the step index reached, so steps computed again
after a fault are waste), recovery times (kill -> the first step the new world takes; median, p95),
steps lost per fault and the check that each step trained on exactly the schedule's samples (so
every sample once per epoch); then OUT/summary.json, OUT/table.md and OUT/chaos.png.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psutil

from benchmarks import chaos_report as report
from benchmarks import group_ended
from hvdkit.core.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]
WORKER = ROOT / "benchmarks" / "chaos_worker.py"
BIN = Path(sys.executable).parent
WAYS = ("in-process", "restart", "none")
DIGITS_TRAIN = 1437  # samples in the digits examples' training split (80 % of 1,797)

HOST_FAILURES = 1_000_000  # in-process way: the faults this benchmark injects never leave the host out


def parse_ways(text: str) -> tuple[str, ...]:
    """``"in-process,restart,none"`` -> the ways in that order; ConfigError naming a bad or repeated one."""
    ways = tuple(w.strip() for w in text.split(","))
    for w in ways:
        if w not in WAYS:
            raise ConfigError(f"--ways: unknown way {w!r}; pass a comma-separated list of {', '.join(WAYS)}")
    if len(set(ways)) != len(ways):
        raise ConfigError(f"--ways names a way twice ({text!r}); name each of {', '.join(WAYS)} at most once")
    return ways


def has_in_process() -> bool:
    """Whether this hvdkit's ``hvdkit run`` has ``--recovery`` (the in-process way)."""
    helped = subprocess.run([str(BIN / "hvdkit"), "run", "--help"], capture_output=True, text=True, timeout=60)
    return "--recovery" in helped.stdout


def argv_of(way: str, jobdir: Path, args: argparse.Namespace) -> list[str]:
    """The launcher's argv for ``way`` (see the module's docstring)."""
    head = [str(BIN / "hvdkit"), "run", "-np", "2", "-H", args.hosts, "--gloo"]
    worker = [sys.executable, str(WORKER), str(jobdir), "--model", args.model, "--pace", str(args.pace)]
    worker += ["--checkpoint-every", str(args.checkpoint_every)]
    if way == "in-process":
        head += ["--min-np", "1", "--max-np", "2", "--elastic-timeout", "60", "--recovery", "in-process"]
        worker += ["--commit-every", str(args.commit_every)]
    elif way == "restart":
        head += ["--min-np", "1", "--max-np", "2", "--elastic-timeout", "60", "--max-restarts", "100000"]
    return [*head, "--", *worker]


class Steps:
    """The step records the ranks append to ``jobdir/steps/*.jsonl``, read as they grow (whole lines only)."""

    def __init__(self, jobdir: Path) -> None:
        self.folder, self.offsets, self.records = jobdir / "steps", {}, []

    def poll(self) -> list[dict]:
        for path in sorted(self.folder.glob("*.jsonl")) if self.folder.exists() else []:
            with open(path, "rb") as f:
                f.seek(self.offsets.get(path, 0))
                data = f.read()
            end = data.rfind(b"\n") + 1
            self.offsets[path] = self.offsets.get(path, 0) + end
            self.records += [json.loads(line) for line in data[:end].splitlines() if line.strip()]
        return self.records


def rank_pids(launcher: int, records: list[dict], since: float) -> dict[int, int]:
    """``{pid: rank}`` of the ranks training now: processes under ``launcher`` that logged one of the
    last two steps reached since ``since``."""
    recent = [r for r in records if r["t"] >= since]
    if not recent:
        return {}
    top = max(r["step"] for r in recent)
    latest = {r["pid"]: r["rank"] for r in sorted(recent, key=lambda r: r["t"]) if r["step"] >= top - 1}
    try:
        tree = {p.pid for p in psutil.Process(launcher).children(recursive=True)}
    except psutil.NoSuchProcess:
        return {}
    return {pid: rank for pid, rank in latest.items() if pid in tree}


def wait_first_step(steps: Steps, proc: subprocess.Popen, timeout: float = 600) -> float:
    """The time of the first step at 2 ranks."""
    end = time.time() + timeout
    while time.time() < end:
        hits = [r["t"] for r in steps.poll() if r["size"] == 2]
        if hits:
            return min(hits)
        if proc.poll() is not None:
            raise RuntimeError(f"the job ended (exit code {proc.returncode}) before its first step at 2 ranks")
        time.sleep(0.2)
    raise RuntimeError(f"no step at 2 ranks within {timeout} s")


class WayAborted(RuntimeError):
    """Another way of a ``--together`` run failed: this one stops too instead of training out its window."""


def inject(
    way: str,
    proc: subprocess.Popen,
    steps: Steps,
    args: argparse.Namespace,
    rng: random.Random,
    abort: threading.Event | None = None,
):
    """Train ``args.minutes`` from the first step at 2 ranks, a kill every ``fault_every`` s; ``(t0, t1, faults,
    loads)``, ``loads`` the machine's 1-minute load average at the start and every 30 s."""
    t0 = wait_first_step(steps, proc)
    t1 = t0 + args.minutes * 60
    faults, due, shown = [], t0 + args.fault_every, time.time()
    loads = [os.getloadavg()[0]]
    while time.time() < t1:
        if abort is not None and abort.is_set():
            raise WayAborted(f"the {way} job was stopped: another way of this run failed")
        records = steps.poll()
        if proc.poll() is not None:
            raise RuntimeError(f"the {way} job ended (exit code {proc.returncode}) before the end of its window")
        last = faults[-1] if faults else None
        if last is not None and last.get("recovery") is None:
            last["recovery"] = report.recovery(records, last["killed_at"])
        since = last["recovery"]["at"] if last and last["recovery"] else t0
        if way != "none" and time.time() >= due and (last is None or last["recovery"]):
            ranks = rank_pids(proc.pid, records, since)
            if len(ranks) == 2:  # back at 2 ranks: kill one of them
                pid = rng.choice(sorted(ranks))
                killed_at = time.time()
                os.kill(pid, signal.SIGKILL)
                faults.append({"due": due, "killed_at": killed_at, "pid": pid, "rank": ranks[pid], "recovery": None})
                due = killed_at + args.fault_every
        if time.time() - shown >= 30:
            shown = time.time()
            loads.append(os.getloadavg()[0])
            reached = max((r["step"] for r in records), default=0)
            print(f"chaos {way}: {shown - t0:.0f}/{t1 - t0:.0f} s, step {reached}, {len(faults)} faults", flush=True)
        time.sleep(0.1)
    return t0, t1, faults, loads


def run_way(
    way: str, out: Path, args: argparse.Namespace, rng: random.Random, abort: threading.Event | None = None
) -> dict:
    """Run ``way`` once in ``out/jobs/<way>``; its record (also written to ``out/<way>.json``)."""
    jobdir = out / "jobs" / way
    jobdir.mkdir(parents=True)
    argv = argv_of(way, jobdir, args)
    env = {k: v for k, v in os.environ.items() if not k.startswith("HOROVOD_")}
    if way == "in-process":  # a fault every S s is the point here, not a failing host: engine fix 09 would
        env["HOROVOD_ELASTIC_HOST_FAILURES"] = str(HOST_FAILURES)  # leave the only host out after 3 in 300 s
    steps = Steps(jobdir)
    with open(jobdir / "job.log", "w") as log:
        job = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=jobdir, start_new_session=True)
        with group_ended(job) as proc:
            t0, t1, faults, loads = inject(way, proc, steps, args, rng, abort)
            (jobdir / "stop").touch()
            code = proc.wait(timeout=300)
    records = steps.poll()
    for f in faults:  # a recovery after the window still counts for its fault
        f["recovery"] = f["recovery"] or report.recovery(records, f["killed_at"])
    schedule = schedule_of(args)
    result = report.way_summary(way, records, faults, schedule, t0, t1)
    result.update(
        argv=[os.path.relpath(a, jobdir) if a.startswith(str(jobdir)) else a for a in argv],
        exit_code=code,
        series=report.useful_series(records, schedule, t0, t1, args.bin),
        fault_times=[round(f["killed_at"] - t0, 3) for f in faults],
        fault_list=[_relative(f, t0) for f in faults],
        load_1min=[round(min(loads), 2), round(max(loads), 2)],
    )
    (out / f"{way}.json").write_text(json.dumps(result, indent=1) + "\n")
    return result


def _relative(fault: dict, t0: float) -> dict:
    rec = fault["recovery"]
    out = {"due_s": round(fault["due"] - t0, 3), "killed_s": round(fault["killed_at"] - t0, 3)}
    out.update(pid=fault["pid"], rank=fault["rank"])
    if rec:
        out.update(recovered_s=round(rec["seconds"], 3), reached=rec["reached"], resumed_step=rec["step"])
        out.update(lost=rec["lost"])
    return out


def run_ways(
    ways: Sequence[str], run: Callable[[str, threading.Event | None], dict], together: bool = False
) -> list[dict]:
    """``run(way, abort)`` for each of ``ways``: one after the other, or (``together``) all at once, each in a
    thread of its own; the records in the order of ``ways``. Together, the first way that fails sets ``abort``
    for the others (their jobs stop at their next check, and are ended) and its error is raised once all
    have returned."""
    if not together:
        return [run(way, None) for way in ways]
    abort = threading.Event()

    def one(way: str) -> dict:
        try:
            return run(way, abort)
        except BaseException:
            abort.set()
            raise

    with ThreadPoolExecutor(max_workers=len(ways), thread_name_prefix="chaos-way") as pool:
        futures = [pool.submit(one, way) for way in ways]
    errors = [f.exception() for f in futures if f.exception() is not None]
    first = next((e for e in errors if not isinstance(e, WayAborted)), errors[0] if errors else None)
    if first is not None:
        raise first
    return [f.result() for f in futures]


def schedule_of(args: argparse.Namespace) -> report.Schedule:
    return report.Schedule(DIGITS_TRAIN, args.global_batch_size, args.global_batch_size // args.batch_size, seed=0)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m benchmarks chaos", description=__doc__.splitlines()[0])
    p.add_argument("--minutes", type=float, required=True, help="training time per way, from its first step at 2 ranks")
    p.add_argument("--fault-every", type=float, required=True, help="seconds between SIGKILLs")
    p.add_argument("--out", type=Path, default=Path(f"docs/bench/chaos-{time.strftime('%Y-%m-%d')}"))
    p.add_argument("--ways", type=parse_ways, default=WAYS, help="comma-separated, of: " + ",".join(WAYS))
    p.add_argument("--hosts", default="localhost:2", help="-H of every way (localhost:1,127.0.0.1:1: two hosts)")
    p.add_argument("--model", choices=("digits", "big"), default="digits", help="big: an MLP of about 100 MB")
    p.add_argument("--pace", type=float, default=0.05, help="seconds each step sleeps after it")
    p.add_argument("--checkpoint-every", type=int, default=20, help="optimizer steps between checkpoints")
    p.add_argument("--commit-every", type=int, default=5, help="optimizer steps between in-memory commits")
    p.add_argument("--bin", type=float, default=5.0, help="seconds per point of the throughput plot")
    p.add_argument("--seed", type=int, default=0, help="of the draw of the rank to kill")
    p.add_argument(
        "--together",
        action="store_true",
        help="run the ways at the same time, side by side under the same load (each draws its kills from its own seed)",
    )
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    args.batch_size, args.global_batch_size = 32, 64  # the worker's defaults
    if args.minutes <= 0 or args.fault_every <= 0:
        raise ConfigError(f"--minutes and --fault-every must be above 0 (got {args.minutes}, {args.fault_every})")
    if "in-process" in args.ways and not has_in_process():
        raise ConfigError("this hvdkit run has no --recovery (the in-process way); pass --ways restart,none")
    out = args.out.resolve()
    if (out / "jobs").exists():
        raise ConfigError(f"{out / 'jobs'} exists (an earlier run's jobs); remove it or pass another --out")
    out.mkdir(parents=True, exist_ok=True)
    rng = random.Random(args.seed)  # one draw for all the ways when they run one after the other, as before

    def run(way: str, abort: threading.Event | None) -> dict:
        return run_way(way, out, args, random.Random(f"{args.seed}-{way}") if args.together else rng, abort)

    ways = run_ways(args.ways, run, args.together)
    summary = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "load": os.getloadavg(),
        "together": args.together,
        "minutes": args.minutes,
        "fault_every_s": args.fault_every,
        "hosts": args.hosts,
        "model": args.model,
        "pace_s": args.pace,
        "checkpoint_every": args.checkpoint_every,
        "commit_every": args.commit_every,
        "bin_s": args.bin,
        "ways": ways,
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    (out / "table.md").write_text(report.table(summary))
    report.plot(summary, str(out / "chaos.png"))
    print(report.table(summary))
    return 0 if all(w["samples"]["ok"] for w in ways) else 1


if __name__ == "__main__":
    sys.exit(main())
