"""The ``hvdkit`` command: ``run``, ``render``, ``doctor``, ``timeline`` and ``bench``."""

import argparse
import os
import sys

from .core import env
from .core.errors import ConfigError, HvdkitError

__all__ = ["main"]


def _parser():
    p = argparse.ArgumentParser(prog="hvdkit", description="Horovod/MPI training toolkit.")
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser(
        "run",
        help="start N ranks of a command under mpirun (or horovodrun --gloo)",
        description="Start N ranks of COMMAND. Example: hvdkit run -np 2 -- python train.py --epochs 3",
    )
    r.add_argument(
        "-np",
        "--num-proc",
        dest="num_proc",
        type=int,
        help="number of processes (default: all slots of the hosts; on this machine alone, one per GPU it has, "
        "CUDA_VISIBLE_DEVICES respected, else one per CPU core)",
    )
    r.add_argument("--gloo", action="store_true", help="use Horovod's Gloo controller via horovodrun instead of MPI")
    r.add_argument("--dry-run", action="store_true", help="print the exact command and exit")
    r.add_argument(
        "-H",
        "--hosts",
        dest="hosts",
        metavar="HOST:SLOTS,...",
        help="hosts and their slots, e.g. node1:2,node2:2 (slots default to 1); wins over every other host source",
    )
    r.add_argument(
        "--hostfile",
        metavar="FILE",
        help="file of 'host slots=N' or 'host:N' lines. Without -H/--hostfile the hosts come from the MPI "
        "Operator's hostfile, else the SLURM allocation, else this machine",
    )
    r.add_argument(
        "--network-interface",
        metavar="IFACE",
        help="network interface the ranks talk over across hosts, e.g. eth0 (mpirun: btl/oob_tcp_if_include; "
        "horovodrun: --network-interface)",
    )
    _env_option(r, "--max-restarts", env.MAX_RESTARTS, env.integer(0), "K", env.DEFAULT_MAX_RESTARTS,
                "relaunch the whole job after a rank fails, at most K times; ranks resume from their newest checkpoint")
    _elastic_options(r)
    _env_option(r, "--stall-timeout", env.STALL_TIMEOUT, env.SECONDS, "SECONDS", None,
                "end the job when a rank stays out of a collective this long, naming it", shown="600")
    _env_option(r, "--grace-period", env.GRACE_PERIOD, env.SECONDS, "SECONDS", env.DEFAULT_GRACE_PERIOD,
                "after SIGTERM/SIGINT, how long ranks get to checkpoint and exit before they are killed")
    r.add_argument(
        "--timeline",
        metavar="FILE",
        help="record Horovod's timeline (HOROVOD_TIMELINE) in FILE: Chrome-trace JSON written by rank 0 on its "
        "host (a restart overwrites it); read it with 'hvdkit timeline FILE' or chrome://tracing",
    )
    r.add_argument(
        "--timeline-mark-cycles",
        action="store_true",
        help="also mark the start of every Horovod cycle in the timeline (HOROVOD_TIMELINE_MARK_CYCLES=1)",
    )
    r.add_argument(
        "-x",
        "--env",
        dest="env_vars",
        action="append",
        default=[],
        metavar="NAME[=VALUE]",
        help="set NAME for every rank on every host (repeatable); NAME alone passes this shell's value, "
        "as mpirun -x does. E.g. -x HVDKIT_NUM_THREADS=1",
    )
    r.add_argument("command", nargs=argparse.REMAINDER, help="the command each rank runs, after '--'")
    _render_parser(sub)
    _timeline_parser(sub)
    from .bench.suite import parser as bench_parser  # framework-free: the workers import torch/TF

    bench_parser(sub.add_parser("bench", help="run the benchmark suite: table, JSON and plots (about 6 minutes on 2 cores)"))
    from .engine.cli import parser as engine_parser

    engine_parser(sub.add_parser("engine", help="build and install the Horovod engine into this environment"))
    d = sub.add_parser("doctor", help="check the installation and run a 2-rank allreduce")
    d.add_argument("--no-smoke", action="store_true", help="skip the 2-rank smoke test")
    d.add_argument("-H", "--hosts", metavar="HOST:SLOTS,...", help="also check these hosts: ssh, versions, route, allreduce")
    d.add_argument("--hostfile", metavar="FILE", help="also check the hosts of this hostfile")
    d.add_argument("--network-interface", metavar="IFACE", help="the interface the job will use across hosts")
    return p


def _env_option(parser, flag, var, kind, metavar, default, text, shown=None):
    """An option the variable ``var`` also sets (the flag wins; ``env.FromEnv``); its help ends with
    "(default: $VAR or DEFAULT)", DEFAULT shown as ``shown`` or ``default``."""
    shown = f"{default:g}" if shown is None else shown
    parser.add_argument(flag, action=env.FromEnv, env_var=var, kind=kind, default=default, metavar=metavar,
                        help=f"{text} (default: ${var} or {shown})")


def _elastic_options(r):
    from .launch.elastic import DEFAULT_DISCOVERY_INTERVAL, DEFAULT_ELASTIC_TIMEOUT

    g = r.add_argument_group(
        "elastic training by restart",
        "With --min-np/--max-np the job relaunches on the hosts that are there (fewer after a failure, more when "
        "discovery lists more), between MIN and MAX ranks; the ranks resume from their newest checkpoint. Every "
        "launch is a plain fixed-size mpirun/horovodrun job: Horovod's elastic driver is never started.",
    )
    g.add_argument("--min-np", dest="min_np", type=int, metavar="MIN", help="fewest ranks to keep training with (default: -np)")
    g.add_argument("--max-np", dest="max_np", type=int, metavar="MAX", help="most ranks to grow to (default: -np)")
    g.add_argument(
        "--host-discovery-script",
        metavar="SCRIPT",
        help="executable printing the hosts there now, one 'host:slots' line each (as horovodrun's); run at every "
        "poll. Without it the hosts of -H/--hostfile/SLURM/the MPI Operator are fixed and ssh decides which are up",
    )
    g.add_argument("--slots-per-host", dest="slots_per_host", action=env.FromEnv, env_var=env.SLOTS_PER_HOST,
                   kind=env.POSITIVE_INT, default=None, metavar="N",
                   help=f"slots of a host the discovery script lists without ':slots' (default: ${env.SLOTS_PER_HOST}, "
                   f"else Open MPI's ${env.OMPI_DEFAULT_SLOTS}, which the MPI Operator sets to slotsPerWorker, else 1)")  # fmt: skip
    _env_option(g, "--discovery-interval", env.DISCOVERY_INTERVAL, env.SECONDS, "SECONDS", DEFAULT_DISCOVERY_INTERVAL,
                "seconds between discovery polls")
    _env_option(g, "--elastic-timeout", env.ELASTIC_TIMEOUT, env.SECONDS, "SECONDS", DEFAULT_ELASTIC_TIMEOUT,
                "with fewer than MIN slots, wait this long for hosts, then fail naming what is missing")


def _render_parser(sub):
    from .launch.render import TARGETS

    job = argparse.ArgumentParser(add_help=False)  # the job description, shared by every target
    job.add_argument("-np", "--num-proc", dest="num_proc", type=int, help="number of ranks (default: all slots)")
    job.add_argument("--nodes", type=int, help="number of machines (default 1, or the number of -H hosts)")
    job.add_argument("--slots-per-node", dest="slots_per_node", type=int, help="ranks per machine (default 1)")
    job.add_argument("--gpus-per-node", dest="gpus_per_node", metavar="N",
                     help="slurm, mpijob: GPUs each machine gives the job, one rank per GPU (slurm: --gres=gpu:N; "
                     "mpijob: nvidia.com/gpu: N); --slots-per-node defaults to it")  # fmt: skip
    job.add_argument("--image", default="hvdkit:cpu", help="container image for mpijob (default hvdkit:cpu)")
    job.add_argument("--name", default="hvdkit-job", help="job name (default hvdkit-job)")
    job.add_argument("--cpu", type=int, help="whole CPUs per worker machine (default: one per slot)")
    job.add_argument("--memory", default="2Gi", help="memory per worker machine, e.g. 4Gi (default 2Gi)")
    job.add_argument("-H", "--hosts", dest="hosts", metavar="HOST:SLOTS,...", help="hosts for mpirun/horovodrun")
    job.add_argument("--hostfile", metavar="FILE", help="read the hosts for mpirun/horovodrun from FILE")
    job.add_argument("--min-np", dest="min_np", type=int, metavar="MIN", help="slurm, mpijob: elastic, the fewest ranks to train with")
    job.add_argument("--max-np", dest="max_np", type=int, metavar="MAX", help="slurm, mpijob: elastic, the most ranks to grow to")
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
        targets.add_parser(target, parents=[job], help=helps[target])


def _render(args):
    from .launch import hosts, render

    command = args.command[1:] if args.command[:1] == ["--"] else args.command
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
        raise ConfigError(f"--min-np/--max-np render only slurm and mpijob files (got {args.target}); for a plain script use hvdkit run")
    text = render.render(args.target, spec)
    if args.output:
        render.save(args.output, text)
    else:
        sys.stdout.write(text)
    return 0


def _timeline_parser(sub):
    t = sub.add_parser(
        "timeline",
        help="summarise a Horovod timeline: time per tensor and activity, communication against waits",
        description="Summarise a timeline written by 'hvdkit run --timeline FILE'. Example: hvdkit timeline "
        "tl.json --top 5 --json tl-summary.json --plot tl.png",
    )
    t.add_argument("file", metavar="FILE", help="the timeline (HOROVOD_TIMELINE) file")
    t.add_argument("--json", metavar="OUT", help="also write the whole summary as JSON to OUT")
    t.add_argument("--plot", metavar="OUT.png", help="also draw the top tensors and the span breakdown to OUT.png")
    t.add_argument("--top", type=int, default=10, metavar="K", help="tensors to show (default 10)")


def _timeline(args):
    from .core.options import check_positive_int
    from .launch import timeline, timeline_plot

    check_positive_int("--top", args.top)
    summary = timeline.summarise(args.file)
    sys.stdout.write(timeline.format_summary(summary, args.top))
    if args.json:
        timeline.write_json(summary, args.json, args.top)
    if args.plot:
        timeline_plot.plot(summary, args.plot, args.top)
    return 0


def _run(args):
    import dataclasses
    import time

    from .launch import execute, hosts, plan, remote, supervise
    from .launch.spec import JobSpec, check_command, parse_env_vars

    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    found, origin = hosts.resolve(host_list=args.hosts, hostfile=args.hostfile, environ=os.environ)
    script = args.host_discovery_script
    if script and (args.hosts or args.hostfile):
        raise ConfigError("--host-discovery-script lists the hosts: give it without -H/--hostfile (or drop it)")
    cores = len(os.sched_getaffinity(0))
    if args.num_proc is None:
        if script:
            raise ConfigError("-np is required with --host-discovery-script: the ranks to start with, e.g. -np 4")
        from .launch.gpus import gpu_count

        args.num_proc, why = plan.default_num_proc(found, cores, 0 if found else gpu_count())
        sys.stderr.write(f"hvdkit run: no -np given: {why}\n")
    if not script:
        hosts.check_slots(found, args.num_proc, origin)
    controller = "gloo" if args.gloo else "mpi"
    restarts_given = env.given(args.max_restarts)
    env.resolve(args)  # flag > HVDKIT_* variable > default
    elastic_settings = _elastic_settings(args, found, origin)
    restarts, stall, grace = args.max_restarts, args.stall_timeout, args.grace_period
    if elastic_settings and not restarts_given:  # an elastic job is meant to survive failures
        from .launch import elastic

        restarts = elastic.DEFAULT_ELASTIC_MAX_RESTARTS
    extra_env = parse_env_vars(args.env_vars, os.environ)
    if stall:
        extra_env[env.STALL_TIMEOUT] = f"{stall:g}"
    spec = JobSpec(
        command=command,
        num_proc=args.num_proc,
        controller=controller,
        hosts=() if script else found,
        env=extra_env,
        network_interface=args.network_interface,
        timeline=args.timeline,
        timeline_mark_cycles=args.timeline_mark_cycles,
    )
    check_command(spec.command)
    is_root = os.geteuid() == 0
    if not found and not script and spec.num_proc > cores:  # said once, not per restart; discovery: ranks run elsewhere
        sys.stderr.write(f"hvdkit run: {plan.oversubscribed(spec.num_proc, cores)}\n")
    if spec.timeline and not args.dry_run:
        from .launch.timeline_flags import ensure_folder

        ensure_folder(spec.timeline)  # Horovod only logs an error and records nothing without it
    if elastic_settings:
        return _run_elastic(args, spec, elastic_settings, restarts, is_root, cores)
    if args.dry_run:
        built = plan.build(spec, is_root=is_root, cores=cores)
        print(" ".join(_quote(a) for a in built.argv))
        return 0
    if not (controller == "mpi" and hosts.mpirun_uses_srun(os.environ)):  # in SLURM, mpirun reaches nodes by srun
        remote.check_reachable(found)  # an unreachable host is an error before anything starts

    def build_plan(job_id, attempt):
        attempt_spec = dataclasses.replace(spec, env={**spec.env, env.RESTART: str(attempt), env.WORLD_SIZE: str(spec.num_proc)})
        return plan.build(attempt_spec, is_root=is_root, cores=cores, job_id=job_id, progress=sys.stderr.isatty())

    started = time.time()
    report = supervise.supervise(build_plan, restarts, grace=grace, forward_usr1=controller == "mpi")
    final = report.final
    if final.interrupted_by is not None and final.exit_code == 0:
        name = execute.signal_name(final.interrupted_by)
        sys.stderr.write(f"hvdkit run: stopped by {name}: every rank exited cleanly (exit code {128 + final.interrupted_by})\n")
        return 128 + final.interrupted_by
    summary = report.summary()
    if summary:
        sys.stderr.write(f"hvdkit run: {summary}\n")
    if spec.timeline and os.path.exists(spec.timeline) and os.path.getmtime(spec.timeline) >= started - 1:
        sys.stderr.write(f"hvdkit run: timeline written; summarise it: hvdkit timeline {_quote(spec.timeline)}\n")
    return final.exit_code


def _elastic_settings(args, found, origin):
    from .core.options import check_positive_int
    from .launch import elastic
    from .launch.discovery import ScriptDiscovery

    for flag, value in (("--min-np", args.min_np), ("--max-np", args.max_np)):
        if value is not None:
            check_positive_int(flag, value, "the fewest/most ranks an elastic job runs with")
    script = args.host_discovery_script
    if script:
        ScriptDiscovery(script).check()
    return elastic.settings_from(
        args.num_proc, args.min_np, args.max_np, script=script and os.path.abspath(script), hosts=found, origin=origin,
        interval=args.discovery_interval, timeout=args.elastic_timeout,
    )  # fmt: skip


def _run_elastic(args, spec, settings, restarts, is_root, cores):
    """``hvdkit run`` with --min-np/--max-np: attempts of fixed size on the hosts there (hvdkit.launch.elastic_main)."""
    from .launch import elastic_main

    return elastic_main.main(spec, settings, script=args.host_discovery_script, restarts=restarts, grace=args.grace_period,
                             dry_run=args.dry_run, is_root=is_root, cores=cores,
                             default_slots=env.discovered_host_slots(args.slots_per_host))  # fmt: skip


def _quote(arg):
    import shlex

    return shlex.quote(arg)


def main(argv=None):
    args = _parser().parse_args(argv)
    try:
        if args.cmd == "run":
            return _run(args)
        if args.cmd == "render":
            return _render(args)
        if args.cmd == "timeline":
            return _timeline(args)
        if args.cmd == "bench":
            from .bench.suite import run_args

            return run_args(args)
        if args.cmd == "engine":
            from .engine.cli import run_args as engine_run_args

            return engine_run_args(args)
        from .launch import hosts
        from .launch.doctor import diagnose

        found = hosts.parse_host_list(args.hosts) if args.hosts else hosts.read_hostfile(args.hostfile) if args.hostfile else ()
        problems = diagnose(smoke=not args.no_smoke, hosts=found, network_interface=args.network_interface)
        return 1 if problems else 0
    except HvdkitError as e:
        sys.stderr.write(f"hvdkit {args.cmd}: error: {e}\n")
        return 2


if __name__ == "__main__":
    sys.exit(main())
