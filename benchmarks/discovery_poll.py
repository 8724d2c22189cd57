"""``python -m benchmarks discovery-poll``: what one run of a host discovery script costs Horovod's elastic driver,
through a Python middleman (upstream) vs as the driver's own child (engine fix 09-elastic-discovery-script-...).

    python -m benchmarks discovery-poll --out docs/bench/discovery-poll-DATE [--runs 30] [--quick]

The driver runs the script once a second for the whole life of an elastic job (``DISCOVER_HOSTS_FREQUENCY_SECS``).
Upstream ran it with ``safe_shell_exec.execute``, which spawns a Python interpreter (the middleman) that starts the
shell; the engine's ``HostDiscoveryScript`` now starts the shell itself. Both are called here in one process on
the same script (``cat`` of a hosts file, as the tests' discovery), interleaved, one run a second as the driver
does: for each run the CPU seconds of this process and its children (the middleman, the shell, ``cat``) and the
wall time; each run's hosts are checked against the file. That process's main module is shaped like horovodrun's
entry point (``from horovod.runner.launch import run_commandline``), because a spawned middleman imports its
parent's main module again, as it does under horovodrun. Writes OUT/discovery-poll.json, OUT/discovery-poll.png
and prints the table: the median per way, and fix / upstream.
"""

import argparse
import io
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time

from benchmarks import save_figure, write_record

__all__ = ["main"]

WAYS = ("middleman", "direct")
LABELS = {"middleman": "Python middleman (upstream)", "direct": "own child (the fix)"}
HOSTS = "localhost:2\n127.0.0.1:1\n"
FIX = "09-elastic-discovery-script-without-a-python-per-poll"


def _engine_has_the_fix():
    """Whether the installed engine carries FIX (else its HostDiscoveryScript still goes through the middleman)."""
    try:
        from horovod import hvdkit_fixes
    except ImportError:
        return False
    return FIX in hvdkit_fixes.FIXES


def _hosts(text):
    """``host:slots`` lines as ``{host: slots}``."""
    return {h: int(s) for h, s in (line.split(":") for line in text.split())}


def _cpu():
    """CPU seconds of this process and of its waited-for children."""
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def _ways(script):
    """Each way's call: the hosts it found, as ``{host: slots}``."""
    from horovod.runner.common.util import safe_shell_exec
    from horovod.runner.elastic.discovery import HostDiscoveryScript

    def middleman():  # what HostDiscoveryScript ran before the fix
        out = io.StringIO()
        code = safe_shell_exec.execute(script, stdout=out)
        if code != 0:
            raise SystemExit(f"discovery-poll: the script failed through safe_shell_exec (exit {code})")
        return _hosts(out.getvalue())

    direct = HostDiscoveryScript(script, 1).find_available_hosts_and_slots
    return {"middleman": middleman, "direct": direct}


# The main module of the measuring process: horovodrun's entry point, plus the loop.
_MAIN = """import json, sys
from horovod.runner.launch import run_commandline  # noqa: F401 - as horovodrun's entry point
if __name__ == "__main__":
    sys.path.insert(0, {root!r})
    from benchmarks.discovery_poll import measure_here
    print(json.dumps(measure_here(int(sys.argv[1]), float(sys.argv[2]))))
"""


def measure(runs, interval):
    """``runs`` runs of each way, interleaved, ``interval`` s apart, in a process whose main module is shaped like
    horovodrun's: a row per run."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    with tempfile.TemporaryDirectory(prefix="hvdkit-discovery-main-") as d:
        main = os.path.join(d, "horovodrun_like.py")
        with open(main, "w", encoding="utf-8") as f:
            f.write(_MAIN.format(root=root))
        done = subprocess.run([sys.executable, main, str(runs), str(interval)], capture_output=True, text=True)
    if done.returncode != 0:
        tail = done.stderr[-3000:]
        raise SystemExit(f"discovery-poll: the measuring process failed (exit {done.returncode}):\n{tail}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def measure_here(runs, interval):
    """``measure`` in this process."""
    want = _hosts(HOSTS)
    rows = []
    with tempfile.TemporaryDirectory(prefix="hvdkit-discovery-poll-") as d:
        hosts, script = os.path.join(d, "hosts"), os.path.join(d, "discover.sh")
        with open(hosts, "w", encoding="utf-8") as f:
            f.write(HOSTS)
        with open(script, "w", encoding="utf-8") as f:
            f.write(f"#!/bin/sh\ncat {hosts}\n")
        os.chmod(script, 0o755)
        ways = _ways(script)
        for i in range(runs):
            for way in WAYS:
                c0, t0 = _cpu(), time.perf_counter()
                got = ways[way]()
                rows.append({"way": way, "run": i, "cpu_s": _cpu() - c0, "wall_s": time.perf_counter() - t0})
                if got != want:
                    raise SystemExit(f"discovery-poll: {way} found {got}, the file lists {want}")
                time.sleep(interval)
    return rows


def summarize(rows, interval=1.0):
    """Per way: the median CPU and wall seconds of a run, and the share of a core that one run a second takes."""
    table = {}
    for way in WAYS:
        cpu = statistics.median(r["cpu_s"] for r in rows if r["way"] == way)
        wall = statistics.median(r["wall_s"] for r in rows if r["way"] == way)
        table[way] = {"cpu_s": cpu, "wall_s": wall, "core_share_at_1_per_s": cpu / interval}
    up, fix = table["middleman"]["cpu_s"], table["direct"]["cpu_s"]
    table["direct_over_middleman_cpu"] = fix / up if up else None
    return table


def table_lines(table):
    lines = ["| way | CPU per run (median) | wall per run (median) | core share at 1 run/s |"]
    lines.append("| --- | --- | --- | --- |")
    for way in WAYS:
        row = table[way]
        share = 100 * row["core_share_at_1_per_s"]
        cells = f"{row['cpu_s'] * 1e3:.1f} ms | {row['wall_s'] * 1e3:.1f} ms | {share:.1f} %"
        lines.append(f"| {LABELS[way]} | {cells} |")
    ratio = table["direct_over_middleman_cpu"]
    lines.append(f"| own child / middleman (CPU) | {'' if ratio is None else f'{ratio:.3f}x'} | | |")
    return lines


def plot(rows, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    for ax, (key, title) in zip(axes, (("cpu_s", "CPU per run (ms)"), ("wall_s", "wall per run (ms)")), strict=True):
        for i, way in enumerate(WAYS):
            vals = [1e3 * r[key] for r in rows if r["way"] == way]
            ax.scatter([i] * len(vals), vals, s=20)
            ax.hlines(statistics.median(vals), i - 0.25, i + 0.25, colors="k")
        ax.set_xticks(range(len(WAYS)), [LABELS[w] for w in WAYS])
        ax.set_title(title, fontsize=10)
        ax.set_ylim(bottom=0)
    fig.suptitle("One run of the host discovery script by Horovod's elastic driver (each dot a run; line: median)")
    save_figure(fig, path)


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m benchmarks discovery-poll", description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, help="folder for discovery-poll.json and discovery-poll.png")
    p.add_argument("--runs", type=int, default=30, help="runs of each way, interleaved, 1 s apart (default: 30)")
    p.add_argument("--quick", action="store_true", help="3 runs each, 0.1 s apart: checks, not figures")
    args = p.parse_args(argv)
    if args.runs < 1:
        p.error(f"--runs must be at least 1 (got {args.runs})")
    from hvdkit.bench.jobs import machine, say

    if not _engine_has_the_fix():
        p.error(f"the installed engine lacks fix {FIX}, so both ways would be the middleman: run `make setup` first")
    os.makedirs(args.out, exist_ok=True)
    runs, interval = (3, 0.1) if args.quick else (args.runs, 1.0)
    say(f"discovery-poll: {runs} runs of each way, {interval:g} s apart")
    m, t0 = machine(), time.perf_counter()
    rows = measure(runs, interval)
    table = summarize(rows, 1.0)
    result = {"runs": rows, "table": table, "machine": m, "load_average_at_end": os.getloadavg(), "quick": args.quick}
    result["seconds"] = time.perf_counter() - t0
    data, png = write_record(args.out, "discovery-poll", result, table_lines(table), plot, rows)
    say(f"discovery-poll: done in {result['seconds']:.0f} s: {data}, {png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
