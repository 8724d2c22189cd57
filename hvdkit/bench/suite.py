"""``hvdkit bench``: measure Horovod through hvdkit where it runs, side by side with the alternatives.

    hvdkit bench [--out DIR] [--quick] [-np 2] [--no-tune]

Each section is a separate job started the way users start theirs (``hvdkit run``), so the
figures include everything a user pays for. Within a job the variants of one comparison run
interleaved and every variant's result is checked before it is timed (see the workers:
``comm_bench``, ``train_bench``, ``keras_bench``, ``ckpt_bench``, ``zero_bench``). ``--quick`` runs every variant
on tiny sizes once: a correctness check of the suite (``make test`` runs it), not a measurement.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Sequence
from typing import Any

from ..core.errors import ConfigError
from . import report
from .jobs import Suite, busy_warning, machine, publish, say

__all__ = ["main", "parser", "run_args", "run_suite"]

DESCRIPTION = """\
Measure Horovod through hvdkit where you run it (this machine, or the hosts of a
SLURM allocation or MPI Operator job, as hvdkit run finds them), side by side
with raw Horovod, mpi4py, torch.distributed and a memory copy."""
EPILOG = """\
sections (each a job of N ranks under hvdkit run; variants interleaved, each
checked before it is timed):
  (a) allreduce bus bandwidth over MPI and Gloo, beside mpi4py, torch.distributed
      and a memory-copy ceiling  (b) fp16 compression  (c) tensor fusion
  (d) PyTorch and Keras training steps against one process, raw Horovod and DDP
  (f) checkpoint save  (g) start-up  (h) ZeRO-1 optimizer state sharding: memory
      per rank, step time, bytes on the wire (in a private network namespace)
  Horovod's cycle time (unless --no-tune)
--breakdown instead runs only the step breakdown: where a training step's time
goes (forward, backward, communication exposed after backward, optimizer, host;
communication hidden behind backward estimated), hvdkit/Horovod beside DDP, at
hvdkit's and at Horovod's defaults (hvdkit.bench.step_sweep; OUT gets
step_sweep.json and step_breakdown.png)

The table goes to stdout, progress to stderr; OUT gets results.json, results.md,
bandwidth.png, scaling.png and zero.png. Run it on a quiet machine: stray ranks of an
earlier job spoil every figure.
"""


def run_suite(out: str, np_: int = 2, quick: bool = False, tune: bool = True) -> dict[str, Any]:
    """Every section; returns the assembled results (also written to ``out``/results.json)."""
    if np_ < 2:
        raise ConfigError(f"-np must be at least 2 (got {np_}): the suite compares 1 rank with N")
    t0 = time.perf_counter()
    suite = Suite(out, np_, quick)
    reps = 1 if quick else 5
    results = {"machine": machine(), "quick": quick, "ranks": np_}
    say(f"{np_} ranks on {results['machine']['cores']} cores; results go to {out}")
    busy = busy_warning(results["machine"]["load_average_at_start"][0], results["machine"]["cores"])
    if busy and not quick:
        say(busy)
    results["comm_mpi"] = suite.job("comm_mpi", "comm_bench")
    results["comm_gloo"] = suite.job("comm_gloo", "comm_bench", gloo=True)
    results["train_torch"] = suite.job("train_torch", "train_bench")
    results["train_keras"] = suite.job("train_keras", "keras_bench")
    results["checkpoint"] = suite.job("checkpoint", "ckpt_bench", ranks=False)
    results["zero"] = suite.zero()
    results["startup"] = suite.startup(reps * 2)
    say("startup: done")
    if tune and not quick:
        results["tuning"] = suite.tuning(3)
    results["goals"] = report.goals(results)
    return publish(results, out, report, t0)


def parser(p: argparse.ArgumentParser | None = None) -> argparse.ArgumentParser:
    """The flags of ``hvdkit bench`` on ``p`` (default: a parser of its own); ``p``."""
    if p is None:
        p = argparse.ArgumentParser(prog="hvdkit bench")
    p.description = DESCRIPTION
    p.epilog = EPILOG
    p.formatter_class = argparse.RawDescriptionHelpFormatter
    p.add_argument(
        "--out", default="build/bench", help="folder for results.json, results.md and the plots (default: build/bench)"
    )
    p.add_argument("-np", "--num-proc", dest="np", type=int, default=2, help="ranks per job (default: 2)")
    p.add_argument(
        "--quick", action="store_true", help="every variant on tiny sizes, once: checks the suite, measures nothing"
    )
    p.add_argument("--no-tune", dest="tune", action="store_false", help="skip the Horovod cycle-time comparison")
    p.add_argument(
        "--breakdown",
        action="store_true",
        help="only the step breakdown, hvdkit/Horovod beside DDP (two jobs; with --quick: toy models)",
    )
    return p


def run_args(args: argparse.Namespace) -> int:
    """Run the suite, or with ``--breakdown`` the step breakdown, from parsed arguments; the exit code."""
    if args.breakdown:
        from . import step_sweep

        if args.np < 2:
            raise ConfigError(f"-np must be at least 2 (got {args.np}): the breakdown averages over ranks")
        step_sweep.run_sweep(args.out, "cpu", args.np, args.quick)
        return step_sweep.report(os.path.join(args.out, "step_sweep.json"))
    run_suite(args.out, args.np, args.quick, args.tune)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    return run_args(parser().parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
