"""``python -m benchmarks suite``: ``hvdkit bench``'s run, then the results section of docs/benchmarks.md.

    python -m benchmarks suite --out docs/bench --docs docs/benchmarks.md [--quick] [-np 2] [--no-tune]

``make bench`` runs it. The measuring is ``hvdkit.bench.suite.run_suite`` (OUT/results.json,
results.md, the plots, the table), the flags ``hvdkit.cli.bench``'s; this module adds only the page's
``bench:results`` section.
"""

import argparse
import os
import sys

from hvdkit.bench import report
from hvdkit.bench.suite import run_suite
from hvdkit.cli.bench import parser as bench_parser

from . import docs

__all__ = ["parser", "main"]


def parser():
    p = bench_parser(argparse.ArgumentParser(prog="python -m benchmarks suite"))
    p.description = "hvdkit bench's suite, then the results section of --docs (make bench)."
    p.add_argument(
        "--docs",
        default=None,
        metavar="PAGE",
        help="also rewrite the bench:results section of this Markdown page (docs/benchmarks.md)",
    )
    return p


def main(argv=None):
    """Run the suite, then write its section of ``--docs``; the exit code."""
    args = parser().parse_args(argv)
    if args.docs:
        docs.check_page(args.docs, docs.RESULTS)  # before minutes of jobs, not after
    results = run_suite(args.out, args.np, args.quick, args.tune)
    if args.docs:
        plots = [os.path.join(args.out, name) for name in report.PLOTS]
        docs.write_results(args.docs, docs.RESULTS, report.markdown, results, plots)
    return 0


if __name__ == "__main__":
    sys.exit(main())
