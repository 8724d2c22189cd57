"""``hvdkit engine install``: build and install the Horovod engine into this Python environment."""

from __future__ import annotations

import argparse
import sys

from ..core.errors import ConfigError

__all__ = ["register", "main"]


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``hvdkit engine`` and its sub-commands to the sub-command parsers ``sub``."""
    p = sub.add_parser("engine", help="build and install the Horovod engine into this environment")
    actions = p.add_subparsers(dest="engine_cmd", required=True, metavar="{install}")
    i = actions.add_parser(
        "install",
        help="build Horovod 0.28.1 with hvdkit's engine fixes for this environment (or reuse the cached wheel) "
        "and install it",
        description="Build Horovod 0.28.1 from its PyPI sdist with hvdkit's engine fixes against the torch and "
        "TensorFlow installed here, cache the wheel (~/.cache/hvdkit/wheels or $HVDKIT_WHEEL_CACHE, the cache "
        "`make setup` uses) and install it. A cache miss compiles for about 6 minutes on 2 cores; a hit takes "
        "seconds. Needs Open MPI with headers, g++, cmake, make and patch. Example: hvdkit engine install",
    )
    i.add_argument("--python", metavar="PY", help="interpreter of the environment to install into (default: this one)")
    i.add_argument(
        "--jobs", type=int, metavar="N", help="parallel compile jobs (default: $HVDKIT_BUILD_JOBS or all cores)"
    )
    variant = i.add_mutually_exclusive_group()
    variant.add_argument(
        "--gpu",
        action="store_const",
        const=True,
        dest="gpu",
        help="build with NCCL for CUDA tensors (default: when torch is a CUDA build); an error says why not",
    )
    variant.add_argument(
        "--cpu",
        action="store_const",
        const=False,
        dest="gpu",
        help="build a CPU engine even where torch is a CUDA build",
    )
    i.add_argument(
        "--cuda-archs",
        metavar="LIST",
        help="CUDA architectures of a GPU build, e.g. 90 (H100) or 80,90,100 (default: the visible GPUs', "
        "else 75,80,86,89,90,100,120)",
    )
    i.add_argument(
        "--dry-run",
        action="store_true",
        help="print the build plan (variant, exact build settings, wheel cache folder) and build nothing",
    )


def main(args: argparse.Namespace) -> int:
    """Run ``hvdkit engine ...`` from parsed arguments; the exit code."""
    from ..engine import install

    if args.jobs is not None and args.jobs < 1:
        raise ConfigError(f"--jobs must be at least 1 (got {args.jobs})")
    if args.dry_run:
        from ..engine import plan

        sys.stdout.write(plan(python=args.python, gpu=args.gpu, cuda_archs=args.cuda_archs) + "\n")
        return 0
    summary = install(python=args.python, jobs=args.jobs, gpu=args.gpu, cuda_archs=args.cuda_archs)
    sys.stderr.write(f"hvdkit engine: {summary}; check it with: hvdkit doctor\n")
    return 0
