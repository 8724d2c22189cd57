"""``hvdkit render``: a ready-to-submit file for one job (SLURM, MPIJob, mpirun/horovodrun script, hostfile)."""

from __future__ import annotations

import argparse
import sys

from ..core.errors import ConfigError

__all__ = ["register", "main"]


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``hvdkit render`` to the sub-command parsers ``sub``."""
    from ..launcher.render.files import TARGETS

    job = argparse.ArgumentParser(add_help=False)  # the job description, shared by every target
    job.add_argument("-np", "--num-proc", dest="num_proc", type=int, help="number of ranks (default: all slots)")
    job.add_argument("--nodes", type=int, help="number of machines (default 1, or the number of -H hosts)")
    job.add_argument("--slots-per-node", dest="slots_per_node", type=int, help="ranks per machine (default 1)")
    job.add_argument(
        "--gpus-per-node",
        dest="gpus_per_node",
        metavar="N",
        help="slurm, mpijob: GPUs each machine gives the job, one rank per GPU (slurm: --gres=gpu:N; "
        "mpijob: nvidia.com/gpu: N); --slots-per-node defaults to it",
    )
    job.add_argument("--image", default="hvdkit:cpu", help="container image for mpijob (default hvdkit:cpu)")
    job.add_argument("--name", default="hvdkit-job", help="job name (default hvdkit-job)")
    job.add_argument("--cpu", type=int, help="whole CPUs per worker machine (default: one per slot)")
    job.add_argument("--memory", default="2Gi", help="memory per worker machine, e.g. 4Gi (default 2Gi)")
    job.add_argument("-H", "--hosts", dest="hosts", metavar="HOST:SLOTS,...", help="hosts for mpirun/horovodrun")
    job.add_argument("--hostfile", metavar="FILE", help="read the hosts for mpirun/horovodrun from FILE")
    job.add_argument(
        "--min-np",
        dest="min_np",
        type=int,
        metavar="MIN",
        help="slurm, mpijob: elastic, the fewest ranks to train with",
    )
    job.add_argument(
        "--max-np", dest="max_np", type=int, metavar="MAX", help="slurm, mpijob: elastic, the most ranks to grow to"
    )
    job.add_argument("-o", "--output", metavar="FILE", help="write here instead of to stdout")
    job.add_argument("command", nargs=argparse.REMAINDER, help="the command each rank runs, after '--'")
    r = sub.add_parser(
        "render",
        help="write a SLURM script, MPIJob, mpirun/horovodrun script or hostfile for a job",
        description="Write a ready-to-submit file for one job. Example: hvdkit render slurm --nodes 2 "
        "--slots-per-node 2 -o job.sbatch -- python train.py",
    )
    targets = r.add_subparsers(dest="target", required=True, metavar="{" + ",".join(TARGETS) + "}")
    helps = {
        "slurm": "SLURM batch script that runs hvdkit run inside the allocation",
        "mpijob": "Kubeflow MPI Operator MPIJob (kubeflow.org/v2beta1)",
        "mpirun": "bash script with the plain mpirun line",
        "horovodrun": "bash script with the plain horovodrun --gloo line",
        "hostfile": "Open MPI hostfile of the hosts",
    }
    for target in TARGETS:
        t = targets.add_parser(target, parents=[job], help=helps[target])
        if target == "slurm":
            t.add_argument(
                "--tune",
                type=int,
                metavar="W",
                help="a job array of W 'hvdkit tune' workers on one study instead of one job: the command after "
                "'--' is 'hvdkit tune ... --storage SHARED ... -- python train.py' (each task: one node, "
                "--parallel x -np slots, results in OUT/task-N)",
            )


def main(args: argparse.Namespace) -> int:
    """Run ``hvdkit render`` from parsed arguments; the exit code."""
    from ..launcher import hosts
    from ..launcher.render import files as render

    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if getattr(args, "tune", None) is not None:
        return _tune_array(args, command)
    if args.hosts:  # only the hosts given count: a render describes another machine, not this one
        found = hosts.parse_host_list(args.hosts)
    else:
        found = hosts.read_hostfile(args.hostfile) if args.hostfile else ()
    spec = render.RenderSpec(
        command=command,
        num_proc=args.num_proc,
        nodes=args.nodes,
        slots_per_node=args.slots_per_node,
        image=args.image,
        name=args.name,
        cpu=args.cpu,
        memory=args.memory,
        hosts=found,
        min_np=args.min_np,
        max_np=args.max_np,
        gpus_per_node=args.gpus_per_node,
    )
    if spec.elastic and args.target not in ("slurm", "mpijob"):
        raise ConfigError(
            f"--min-np/--max-np render only slurm and mpijob files (got {args.target}); for a plain script use "
            "hvdkit run"
        )
    text = render.render(args.target, spec)
    if args.output:
        render.save(args.output, text)
    else:
        sys.stdout.write(text)
    return 0


def plan_array(command: list[str], workers: int, name: str, memory: str = "2Gi"):
    """``hvdkit.tune.array.plan_tune_array`` with ``hvdkit tune``'s own parser for the worker command."""
    from ..tune.array import plan_tune_array
    from . import tune

    def parse(words: list[str]) -> argparse.Namespace:
        parser = argparse.ArgumentParser(prog="hvdkit", add_help=False)
        tune.register(parser.add_subparsers(dest="sub"))
        return parser.parse_args(["tune", *words])

    return plan_tune_array(command, workers, name, memory, parse)


# what a --tune worker's size comes from instead (its --parallel x -np): these job flags do not apply
_NOT_WITH_TUNE = (
    "num_proc",
    "nodes",
    "slots_per_node",
    "gpus_per_node",
    "hosts",
    "hostfile",
    "min_np",
    "max_np",
    "cpu",
)


def _tune_array(args: argparse.Namespace, command: list[str]) -> int:
    from ..launcher.render import files as render
    from ..tune.array import render_tune_array

    given = [name for name in _NOT_WITH_TUNE if getattr(args, name) is not None]
    if given:
        flags = ", ".join("--" + name.replace("_", "-") for name in given)
        raise ConfigError(
            f"--tune sizes each worker from the hvdkit tune command (one node, --parallel x -np slots): drop {flags}"
        )
    text = render_tune_array(plan_array(command, args.tune, args.name, args.memory))
    if args.output:
        render.save(args.output, text)
    else:
        sys.stdout.write(text)
    return 0
