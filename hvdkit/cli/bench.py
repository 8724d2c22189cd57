"""``hvdkit bench``: the user's own benchmark of this machine or cluster; its flags (the measuring is
``hvdkit.bench``: ``suite.run_suite``, with ``--breakdown`` ``step_sweep``).

    hvdkit bench [--out DIR] [--quick] [-np 2] [--no-tune] [--breakdown]
"""

from __future__ import annotations

import argparse
import os

from ..core.errors import ConfigError

__all__ = ["register", "main", "parser"]

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


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``hvdkit bench`` to the sub-command parsers ``sub``."""
    help_ = "measure Horovod through hvdkit here: a table, JSON and plots (about 6 minutes on 2 cores)"
    parser(sub.add_parser("bench", help=help_))


def main(args: argparse.Namespace) -> int:
    """Run the suite, or with ``--breakdown`` the step breakdown, from parsed arguments; the exit code."""
    # imported here: framework-free, but `hvdkit --help` need not load the suite
    if args.breakdown:
        from ..bench import step_sweep

        if args.np < 2:
            raise ConfigError(f"-np must be at least 2 (got {args.np}): the breakdown averages over ranks")
        step_sweep.run_sweep(args.out, "cpu", args.np, args.quick)
        return step_sweep.report(os.path.join(args.out, "step_sweep.json"))
    from ..bench.suite import run_suite

    run_suite(args.out, args.np, args.quick, args.tune)
    return 0
