"""The ``hvdkit`` command: ``run`` and ``doctor``."""

import argparse
import os
import shutil
import sys
import tempfile

from .core.errors import HvdkitError

__all__ = ["main"]


def _parser():
    p = argparse.ArgumentParser(prog="hvdkit", description="Horovod/MPI training toolkit.")
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser(
        "run",
        help="start N ranks of a command under mpirun (or horovodrun --gloo)",
        description="Start N ranks of COMMAND. Example: hvdkit run -np 2 -- python train.py --epochs 3",
    )
    r.add_argument("-np", "--num-proc", dest="num_proc", type=int, required=True, help="number of processes")
    r.add_argument("--gloo", action="store_true", help="use Horovod's Gloo controller via horovodrun instead of MPI")
    r.add_argument("--dry-run", action="store_true", help="print the exact command and exit")
    r.add_argument("command", nargs=argparse.REMAINDER, help="the command each rank runs, after '--'")
    d = sub.add_parser("doctor", help="check the installation and run a 2-rank allreduce")
    d.add_argument("--no-smoke", action="store_true", help="skip the 2-rank smoke test")
    return p


def _run(args):
    from .launch import execute, plan
    from .launch.spec import JobSpec, check_command

    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    spec = JobSpec(command=command, num_proc=args.num_proc, controller="gloo" if args.gloo else "mpi")
    check_command(spec.command)
    is_root = os.geteuid() == 0
    cores = len(os.sched_getaffinity(0))
    if args.dry_run:
        built = plan.build(spec, is_root=is_root, cores=cores)
        print(" ".join(_quote(a) for a in built.argv))
        return 0
    status_dir = tempfile.mkdtemp(prefix="hvdkit-run-")
    try:
        built = plan.build(spec, is_root=is_root, cores=cores, status_dir=status_dir, progress=sys.stderr.isatty())
        result = execute.run(built, status_dir=status_dir)
    finally:
        shutil.rmtree(status_dir, ignore_errors=True)
    if result.exit_code != 0:
        sys.stderr.write(f"hvdkit run: {result.message} (exit code {result.exit_code})\n")
    return result.exit_code


def _quote(arg):
    import shlex

    return shlex.quote(arg)


def main(argv=None):
    args = _parser().parse_args(argv)
    try:
        if args.cmd == "run":
            return _run(args)
        from .launch.doctor import diagnose

        return 1 if diagnose(smoke=not args.no_smoke) else 0
    except HvdkitError as e:
        sys.stderr.write(f"hvdkit {args.cmd}: error: {e}\n")
        return 2


if __name__ == "__main__":
    sys.exit(main())
