"""``hvdkit bench``: the whole benchmark suite in one run, with a table, JSON and plots.

    hvdkit bench [--out DIR] [--quick] [--docs docs/benchmarks.md] [-np 2]

Each section is a separate job started the way users start theirs (``hvdkit run``), so the
figures include everything a user pays for. Within a job the variants of one comparison run
interleaved and every variant's result is checked before it is timed (see the workers:
``comm_bench``, ``train_bench``, ``keras_bench``, ``ckpt_bench``). ``--quick`` runs every variant
on tiny sizes once: a correctness check of the suite (``make test`` runs it), not a measurement.
"""

import argparse
import os
import sys
import time

from ..core.errors import ConfigError
from . import report
from .jobs import Suite, busy_warning, machine, publish, say

__all__ = ["main", "run_suite"]


def run_suite(out, np_=2, quick=False, docs=None, tune=True):
    """Every section; returns the assembled results (also written to ``out``/results.json)."""
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
    results["startup"] = suite.startup(reps * 2)
    say("startup: done")
    if tune and not quick:
        results["tuning"] = suite.tuning(3)
    results["goals"] = report.goals(results)
    return publish(results, out, docs, report, t0)


def parser(p=None):
    p = p or argparse.ArgumentParser(prog="hvdkit bench", description=__doc__.splitlines()[0])
    p.add_argument("--out", default="build/bench", help="folder for results.json, results.md and the plots (default: build/bench)")
    p.add_argument("-np", "--num-proc", dest="np", type=int, default=2, help="ranks per job (default: 2)")
    p.add_argument("--quick", action="store_true", help="every variant on tiny sizes, once: checks the suite, measures nothing")
    p.add_argument("--docs", default=None, help="also rewrite the results section of this Markdown file (docs/benchmarks.md)")
    p.add_argument("--no-tune", dest="tune", action="store_false", help="skip the Horovod settings comparison")
    p.add_argument("--hosts", type=int, default=None, help="2: run the network section instead, across two emulated "
                   "hosts (network namespaces, needs root; hvdkit.bench.network)")
    p.add_argument("--predict", action="store_true", help="run nothing: the scaling model, checked against Horovod's "
                   "published figures, calibrated on OUT/results.json (else docs/bench/results.json), at 2-512 ranks")
    p.add_argument("--link", action="append", default=None, metavar="RATE",
                   help="with --hosts: link rate(s) to shape the hosts' link to, e.g. 1gbit, 10gbit, unlimited "
                   "(repeatable; default: all three)")
    return p


def run_args(args):
    """Run the suite from parsed arguments (``hvdkit bench``); the exit code."""
    if args.np < 2:
        raise ConfigError(f"-np must be at least 2 (got {args.np}): the suite compares 1 rank with N")
    if args.docs and not os.path.isfile(args.docs):
        raise ConfigError(f"--docs {args.docs!r} is not a file; pass the Markdown file to update (docs/benchmarks.md)")
    if args.predict:  # no jobs: the scaling model on the recorded results (hvdkit.bench.predict)
        from .predict import run_predict

        return run_predict(args.out, args.docs)
    if args.hosts is not None or args.link:
        from .network import RATES, check_ready, run_network

        rates = tuple(args.link or RATES)
        check_ready(args.hosts or 2, rates)
        run_network(args.out, rates, args.quick, args.docs)
        return 0
    run_suite(args.out, args.np, args.quick, args.docs, args.tune)
    return 0


def main(argv=None):
    return run_args(parser().parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
