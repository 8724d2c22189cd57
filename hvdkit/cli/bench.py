"""``hvdkit bench``: the benchmark suite (its flags and its run live in ``hvdkit.bench.suite``)."""

__all__ = ["register", "main"]


def register(sub):
    """Add ``hvdkit bench`` to the sub-command parsers ``sub``."""
    from ..bench.suite import parser  # framework-free: the workers import torch/TF

    parser(sub.add_parser("bench", help="run the benchmark suite: table, JSON and plots (about 6 minutes on 2 cores)"))


def main(args):
    """Run ``hvdkit bench`` from parsed arguments; the exit code."""
    from ..bench.suite import run_args

    return run_args(args)
