"""``python -m benchmarks zero``: section (h) of ``hvdkit bench`` alone, ZeRO-1 against the unsharded optimizer.

    python -m benchmarks zero --out docs/bench/zero-DATE [-np 2] [--quick]

Runs the section's three jobs (``hvdkit.bench.jobs.Suite.zero``: both variants timed side by side
over MPI, then each alone over Gloo in a private network namespace for its memory and its bytes on
the wire) without the rest of the suite; writes OUT/zero.json (the section and the machine),
OUT/zero.png and prints the table. ``python -m benchmarks predict`` reads the newest
docs/bench/zero-*/zero.json for its ZeRO-1 prediction.
"""

import argparse
import json
import os
import sys
import time

from hvdkit.bench import report
from hvdkit.bench.jobs import Suite, busy_warning, machine, say

__all__ = ["main"]


def main(argv=None):
    """Run section (h) into ``--out``; the exit code."""
    p = argparse.ArgumentParser(prog="python -m benchmarks zero", description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, help="folder for zero.json, zero.png and the jobs' JSON")
    p.add_argument("-np", "--num-proc", dest="np", type=int, default=2, help="ranks per job (default: 2)")
    p.add_argument("--quick", action="store_true", help="tiny model, once: checks the section, measures nothing")
    args = p.parse_args(argv)
    t0 = time.perf_counter()
    m = machine()
    busy = busy_warning(m["load_average_at_start"][0], m["cores"])
    if busy:
        say(busy)
    zero = Suite(args.out, args.np, args.quick).zero()
    zero["machine"] = m
    zero["load_average_at_end"] = os.getloadavg()
    zero["quick"] = args.quick
    zero["seconds"] = time.perf_counter() - t0
    with open(os.path.join(args.out, "zero.json"), "w", encoding="utf-8") as f:
        json.dump(zero, f, indent=1)
    print("\n".join(report.zero_table(zero, args.np)).strip())
    report.zero_plot(zero, os.path.join(args.out, "zero.png"))
    say(f"zero: done in {zero['seconds']:.0f} s: {args.out}/zero.json, zero.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
