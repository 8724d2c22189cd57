"""``python -m benchmarks elastic``: recovery times of the two ways to train elastically, side by side.

    python -m benchmarks elastic --reps 3 --out docs/bench/elastic-YYYY-MM-DD

Each repetition runs benchmarks/elastic_worker.py twice on this machine, 2 ranks on the hosts
``localhost`` and ``127.0.0.1`` (both this machine: no ssh), once per way:
  horovod  horovodrun -np 2 --min-np 1 --max-np 2 --gloo --host-discovery-script: hvd.elastic.run
           (in-process: the survivors go back to their last commit and go on);
  hvdkit   hvdkit run -np 2 --min-np 1 --max-np 2 --gloo --host-discovery-script --discovery-interval 1
           (restart-based: the job is relaunched and resumes from its newest checkpoint);
  hvdkit-in-process
           hvdkit run -np 2 --min-np 1 --max-np 2 --gloo --host-discovery-script --recovery in-process:
           the worker written with hk.Trainer(commit_every=1) (Horovod's elastic driver; the survivors
           go back to the last in-memory commit).
All commit / checkpoint after every step; Horovod's driver polls discovery every second, and hvdkit's
is given the same interval. Events, after 20 steps at 2 ranks: the worker on 127.0.0.1 is SIGKILLed
and its host removed from discovery at the same moment (``kill``: time until a step ends on the
survivor); after 30 steps at 1 rank (several seconds) the host is listed again (``add``: time until
a step ends at 2 ranks). Horovod's driver blacklists a host whose worker failed, for good by default:
it gets ``--blacklist-cooldown-range 1 2`` so that the host may come back (the cooldown has passed
before the host is listed again). Writes OUT/<way>-<rep>.json and OUT/summary.json, OUT/elastic.png and OUT/table.md.
"""

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

from benchmarks import group_ended
from hvdkit.core.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]
WORKER = ROOT / "benchmarks" / "elastic_worker.py"
BIN = Path(sys.executable).parent
WAYS = ("horovod", "hvdkit", "hvdkit-in-process")


def argv_of(way, out, discover):
    if way == "horovod":
        head = [str(BIN / "horovodrun"), "-np", "2", "--min-np", "1", "--max-np", "2", "--elastic-timeout", "60"]
        head += ["--host-discovery-script", str(discover), "--blacklist-cooldown-range", "1", "2", "--gloo"]
    elif way == "hvdkit":
        head = [str(BIN / "hvdkit"), "run", "-np", "2", "--min-np", "1", "--max-np", "2", "--gloo"]
        head += ["--host-discovery-script", str(discover), "--discovery-interval", "1", "--elastic-timeout", "60", "--"]
    else:  # Horovod's driver polls discovery every second by itself
        head = [str(BIN / "hvdkit"), "run", "-np", "2", "--min-np", "1", "--max-np", "2", "--gloo"]
        head += ["--host-discovery-script", str(discover), "--elastic-timeout", "60", "--recovery", "in-process", "--"]
    return [*head, sys.executable, str(WORKER), way, str(out)]


def steps(out):
    path = out / "steps.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.endswith("}")]


def wait_for(out, proc, what, test, timeout=180):
    """The first step record (in file order) for which ``test`` holds; raise after ``timeout`` s."""
    end = time.time() + timeout
    while time.time() < end:
        hits = [s for s in steps(out) if test(s)]
        if hits:
            return hits[0]
        if proc.poll() is not None:
            raise RuntimeError(f"the job ended (exit code {proc.returncode}) while waiting for {what}")
        time.sleep(0.05)
    raise RuntimeError(f"no {what} within {timeout} s")


def set_hosts(out, text):
    (out / "hosts.tmp").write_text(text)
    os.replace(out / "hosts.tmp", out / "hosts")


def one_run(way, out):
    """Run ``way`` once in the empty folder ``out``; its measurements (a dict)."""
    out.mkdir(parents=True)
    set_hosts(out, "localhost:1\n127.0.0.1:1\n")
    discover = out / "discover.sh"
    discover.write_text(f"#!/bin/sh\ncat {out / 'hosts'}\n")
    discover.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith("HOROVOD_")}
    log = open(out / "job.log", "w")
    started = time.time()
    popen = subprocess.Popen(
        argv_of(way, out, discover), stdout=log, stderr=subprocess.STDOUT, env=env, cwd=out, start_new_session=True
    )
    with log, group_ended(popen) as proc:
        first = wait_for(out, proc, "a first step at 2 ranks", lambda s: s["size"] == 2)
        victim = wait_for(
            out, proc, "20 steps at 2 ranks", lambda s: s["size"] == 2 and s["step"] >= 20 and s["host"] == "127.0.0.1"
        )
        killed_at = time.time()
        set_hosts(out, "localhost:1\n")
        os.kill(victim["pid"], signal.SIGKILL)
        resumed = wait_for(
            out, proc, "a step at 1 rank after the kill", lambda s: s["t"] > killed_at and s["size"] == 1
        )
        base = resumed["step"]
        wait_for(out, proc, "30 steps at 1 rank", lambda s: s["size"] == 1 and s["step"] >= base + 30)
        added_at = time.time()
        set_hosts(out, "localhost:1\n127.0.0.1:1\n")
        try:
            joined = wait_for(
                out, proc, "step at 2 ranks after the add", lambda s: s["t"] > added_at and s["size"] == 2, 240
            )
            grown = joined["step"]
            wait_for(out, proc, "5 steps at 2 ranks", lambda s: s["size"] == 2 and s["step"] >= grown + 5)
            missed = None
        except RuntimeError as e:  # recorded, not fatal: the other ways' runs still count
            joined, missed = None, str(e)
        (out / "stop").touch()
        code = proc.wait(timeout=120)
    return {
        "way": way,
        "exit_code": code,
        "start_s": round(first["t"] - started, 3),
        "kill_to_resumed_s": round(resumed["t"] - killed_at, 3),
        "steps_at_kill": victim["step"],
        "resumed_at_step": resumed["step"],
        "add_to_joined_s": round(joined["t"] - added_at, 3) if joined else None,
        **({"add_missed": missed} if missed else {}),
    }


def plot(summary, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ways = list(summary["runs"])
    gap = len(ways) + 1
    fig, ax = plt.subplots(figsize=(6.5, 3.4))
    labels = ("kill_to_resumed_s", "add_to_joined_s")
    for i, way in enumerate(ways):
        for j, key in enumerate(labels):
            values = [r[key] for r in summary["runs"][way] if r[key] is not None]
            if not values:
                continue
            x = j * gap + i
            ax.scatter([x] * len(values), values, color=f"C{i}", label=way if j == 0 else None)
            ax.hlines(statistics.median(values), x - 0.3, x + 0.3, color=f"C{i}")
    middle = (len(ways) - 1) / 2
    ax.set_xticks([middle, gap + middle], ["worker killed -> resumed", "host added -> joined"])
    ax.set_yscale("log")
    ax.set_ylabel("seconds (log scale)")
    ax.set_title("Elastic recovery, 2 ranks on one machine (lines: medians)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def _cell(values, runs):
    got = [v for v in values if v is not None]
    if not got:
        return f"- (none of {runs} joined)"
    text = f"{statistics.median(got):.1f} (min {min(got):.1f}, max {max(got):.1f})"
    return text + (f", {runs - len(got)} of {runs} never joined" if len(got) < runs else "")


def table(summary):
    """The markdown table: per way, the median (min, max) seconds of the two events."""
    rows = ["| way | worker killed -> training resumed (s) | host added -> it trains (s) | runs |", "|---|---|---|---|"]
    for way, runs in summary["runs"].items():
        k = [r["kill_to_resumed_s"] for r in runs]
        a = [r["add_to_joined_s"] for r in runs]
        rows.append(f"| {way} | {_cell(k, len(runs))} | {_cell(a, len(runs))} | {len(runs)} |")
    return "\n".join(rows) + "\n"


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m benchmarks elastic", description=__doc__.splitlines()[0])
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--ways", default=",".join(WAYS), help="comma-separated, of: " + ",".join(WAYS))
    args = p.parse_args(argv)
    ways = [w.strip() for w in args.ways.split(",")]
    for w in ways:
        if w not in WAYS:
            raise ConfigError(f"--ways: unknown way {w!r}; pass a comma-separated list of {', '.join(WAYS)}")
    args.out = args.out.resolve()  # the jobs run in their own folders
    args.out.mkdir(parents=True, exist_ok=True)
    runs = {way: [] for way in ways}
    for rep in range(1, args.reps + 1):
        for way in ways:  # alternated, so that a change of machine load hits both ways alike
            result = one_run(way, args.out / "jobs" / f"{way}-{rep}")
            (args.out / f"{way}-{rep}.json").write_text(json.dumps(result, indent=1) + "\n")
            print(json.dumps(result), flush=True)
            runs[way].append(result)
    summary = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "load": os.getloadavg(), "runs": runs}
    (args.out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    plot(summary, args.out / "elastic.png")
    (args.out / "table.md").write_text(table(summary))
    print(table(summary))


if __name__ == "__main__":
    main()
