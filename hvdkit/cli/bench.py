"""``hvdkit bench``: the user's own benchmark of this machine or cluster (flags and run: ``hvdkit.bench.suite``)."""

from __future__ import annotations

import argparse

__all__ = ["register", "main"]


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``hvdkit bench`` to the sub-command parsers ``sub``."""
    from ..bench.suite import parser  # framework-free: the workers import torch/TF

    help_ = "measure Horovod through hvdkit here: a table, JSON and plots (about 6 minutes on 2 cores)"
    parser(sub.add_parser("bench", help=help_))


def main(args: argparse.Namespace) -> int:
    """Run ``hvdkit bench`` from parsed arguments; the exit code."""
    from ..bench.suite import run_args

    return run_args(args)
