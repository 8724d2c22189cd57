"""``python -m hvdkit.tune.pin CORES -- PROGRAM ARGS``: run PROGRAM (exec, same pid) on the CPU cores
CORES (``0,1``) only. ``hvdkit tune`` starts each trial's ``hvdkit run`` through it, so the trial's ranks
inherit the cores and ``hvdkit run`` counts them as this machine's slots."""

from __future__ import annotations

import os
import sys


def main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[1] != "--":
        sys.stderr.write("usage: python -m hvdkit.tune.pin CORES -- PROGRAM [ARGS...]\n")
        return 2
    os.sched_setaffinity(0, {int(c) for c in argv[0].split(",")})
    os.execvp(argv[2], argv[2:])
    return 127  # not reached: execvp raises on failure


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
