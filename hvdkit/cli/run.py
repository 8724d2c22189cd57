"""``hvdkit run``: start N ranks of a command, fixed-size (restarts on failure) or elastic."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from ..core import env
from ..core.errors import ConfigError

if TYPE_CHECKING:
    from ..launcher.elastic.rules import ElasticSettings
    from ..launcher.hosts import Host
    from ..launcher.job import RunOptions
    from ..launcher.spec import JobSpec

__all__ = ["register", "main"]


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``hvdkit run`` to the sub-command parsers ``sub``."""
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
    _env_option(
        r,
        "--max-restarts",
        env.MAX_RESTARTS,
        env.integer(0),
        "K",
        env.DEFAULT_MAX_RESTARTS,
        "relaunch the whole job after a rank fails, at most K times; ranks resume from their newest checkpoint",
    )
    _elastic_options(r)
    _env_option(
        r,
        "--stall-timeout",
        env.STALL_TIMEOUT,
        env.SECONDS,
        "SECONDS",
        None,
        "end the job when a rank stays out of a collective this long, naming it",
        shown="600",
    )
    _env_option(
        r,
        "--grace-period",
        env.GRACE_PERIOD,
        env.SECONDS,
        "SECONDS",
        env.DEFAULT_GRACE_PERIOD,
        "after SIGTERM/SIGINT, how long ranks get to checkpoint and exit before they are killed",
    )
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


def _env_option(
    parser: argparse.ArgumentParser | argparse._ArgumentGroup,
    flag: str,
    var: str,
    kind: env.Kind,
    metavar: str,
    default: float | None,
    text: str,
    shown: str | None = None,
) -> None:
    """An option the variable ``var`` also sets (the flag wins; ``env.FromEnv``); its help ends with
    "(default: $VAR or DEFAULT)", DEFAULT shown as ``shown`` or ``default``."""
    shown = f"{default:g}" if shown is None else shown
    parser.add_argument(
        flag,
        action=env.FromEnv,
        env_var=var,
        kind=kind,
        default=default,
        metavar=metavar,
        help=f"{text} (default: ${var} or {shown})",
    )


def _elastic_options(r: argparse.ArgumentParser) -> None:
    from ..launcher.elastic.rules import DEFAULT_DISCOVERY_INTERVAL, DEFAULT_ELASTIC_TIMEOUT, RECOVERY_WAYS

    g = r.add_argument_group(
        "elastic training by restart",
        "With --min-np/--max-np the job relaunches on the hosts that are there (fewer after a failure, more when "
        "discovery lists more), between MIN and MAX ranks; the ranks resume from their newest checkpoint. Every "
        "launch is a plain fixed-size mpirun/horovodrun job: Horovod's elastic driver is not started (unless "
        "--horovod-elastic, for hvd.elastic.run scripts).",
    )
    g.add_argument(
        "--min-np", dest="min_np", type=int, metavar="MIN", help="fewest ranks to keep training with (default: -np)"
    )
    g.add_argument("--max-np", dest="max_np", type=int, metavar="MAX", help="most ranks to grow to (default: -np)")
    g.add_argument(
        "--host-discovery-script",
        metavar="SCRIPT",
        help="executable printing the hosts there now, one 'host:slots' line each (as horovodrun's); run at every "
        "poll. Without it the hosts of -H/--hostfile/SLURM/the MPI Operator are fixed and ssh decides which are up",
    )
    g.add_argument(
        "--slots-per-host",
        dest="slots_per_host",
        action=env.FromEnv,
        env_var=env.SLOTS_PER_HOST,
        kind=env.POSITIVE_INT,
        default=None,
        metavar="N",
        help=f"slots of a host the discovery script lists without ':slots' (default: ${env.SLOTS_PER_HOST}, "
        f"else Open MPI's ${env.OMPI_DEFAULT_SLOTS}, which the MPI Operator sets to slotsPerWorker, else 1)",
    )
    _env_option(
        g,
        "--discovery-interval",
        env.DISCOVERY_INTERVAL,
        env.SECONDS,
        "SECONDS",
        DEFAULT_DISCOVERY_INTERVAL,
        "seconds between discovery polls",
    )
    _env_option(
        g,
        "--elastic-timeout",
        env.ELASTIC_TIMEOUT,
        env.SECONDS,
        "SECONDS",
        DEFAULT_ELASTIC_TIMEOUT,
        "with fewer than MIN slots, wait this long for hosts, then fail naming what is missing",
    )
    g.add_argument(
        "--horovod-elastic",
        dest="horovod_elastic",
        action="store_true",
        help="for scripts written with Horovod's hvd.elastic.run (state.commit()): run them under Horovod's own "
        "elastic driver instead (one horovodrun --gloo job with these --min-np/--max-np/--host-discovery-script/"
        "--slots-per-host/--elastic-timeout, and --timeline and --stall-timeout; the surviving workers go on "
        "in-process from the last commit, no restarts: --max-restarts and --discovery-interval are refused)",
    )
    g.add_argument(
        "--recovery",
        choices=RECOVERY_WAYS,
        default=None,
        help="how an hvdkit job (hk.Trainer, or a loop under hk.elastic.run) survives a lost worker: 'restart' "
        "(default: relaunch the job, the ranks resume from their newest checkpoint; MPI or Gloo, any script with "
        "hk.Checkpointer/PreemptionGuard) or 'in-process' (Horovod's elastic driver over Gloo: the survivors go "
        "back to their last in-memory commit and go on at the smaller size in the same processes; a new worker "
        "joins at the next commit). docs/elastic.md says which to use",
    )


def main(args: argparse.Namespace) -> int:
    """Run ``hvdkit run`` from parsed arguments; the exit code."""
    from ..launcher import plan
    from ..launcher.job import run_job
    from ..launcher.spec import check_command

    spec, options = job_of(args)
    check_command(spec.command)
    if not spec.hosts and not options.discovery_script and spec.num_proc > _cores():  # said once, not per restart
        sys.stderr.write(f"hvdkit run: {plan.oversubscribed(spec.num_proc, _cores())}\n")
    if spec.timeline and not options.dry_run:
        from ..launcher.timeline_flags import ensure_folder

        ensure_folder(spec.timeline)  # Horovod only logs an error and records nothing without it
    return run_job(spec, options)


def job_of(args: argparse.Namespace) -> tuple[JobSpec, RunOptions]:
    """The frozen ``(JobSpec, RunOptions)`` that ``hvdkit run``'s flags ask for (flag > HVDKIT_* variable >
    default). Raises ConfigError naming a flag that cannot work."""
    from ..launcher import hosts, plan
    from ..launcher.job import RunOptions
    from ..launcher.spec import JobSpec, parse_env_vars

    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    found, origin = hosts.resolve(host_list=args.hosts, hostfile=args.hostfile, environ=os.environ)
    script = args.host_discovery_script
    if script and (args.hosts or args.hostfile):
        raise ConfigError("--host-discovery-script lists the hosts: give it without -H/--hostfile (or drop it)")
    num_proc = args.num_proc
    if num_proc is None:
        if script:
            raise ConfigError("-np is required with --host-discovery-script: the ranks to start with, e.g. -np 4")
        from ..launcher.gpus import gpu_count

        num_proc, why = plan.default_num_proc(found, _cores(), 0 if found else gpu_count())
        sys.stderr.write(f"hvdkit run: no -np given: {why}\n")
    if not script:
        hosts.check_slots(found, num_proc, origin)
    restarts_given = env.given(args.max_restarts)
    in_process = args.recovery == "in-process"
    if in_process and args.horovod_elastic:
        raise ConfigError(
            "--recovery in-process and --horovod-elastic both run Horovod's elastic driver, for different scripts: "
            "--recovery in-process for hvdkit scripts (hk.Trainer, hk.elastic.run), --horovod-elastic for scripts "
            "written with hvd.elastic.run; give one of them"
        )
    if args.horovod_elastic or in_process:
        flag = "--recovery in-process" if in_process else "--horovod-elastic"
        _refuse_under_horovod_elastic(restarts_given, env.given(args.discovery_interval), flag)
    env.resolve(args)  # flag > HVDKIT_* variable > default
    if (args.horovod_elastic or in_process) and not found and not script:
        # Horovod's driver replaces a lost worker on the same host (engine fix 09): one machine is enough
        found, origin = (hosts.Host("localhost", num_proc),), "this machine"
    elastic_settings = _elastic_settings(args, num_proc, found, origin)
    if (args.horovod_elastic or in_process) and elastic_settings is None:
        flag = "--recovery in-process" if in_process else "--horovod-elastic"
        raise ConfigError(
            f"{flag} runs Horovod's elastic driver, which needs the elastic bounds: add --min-np and "
            "--max-np (e.g. --min-np 1 --max-np 2), and --host-discovery-script when hosts come and go"
        )
    restarts = args.max_restarts
    if elastic_settings and not restarts_given:  # an elastic job is meant to survive failures
        from ..launcher.elastic.rules import DEFAULT_ELASTIC_MAX_RESTARTS

        restarts = DEFAULT_ELASTIC_MAX_RESTARTS
    spec = JobSpec(
        command=command,
        num_proc=num_proc,
        controller="gloo" if args.gloo else "mpi",
        hosts=() if script else found,
        env=_job_env(parse_env_vars(args.env_vars, os.environ), in_process),
        network_interface=args.network_interface,
        timeline=args.timeline,
        timeline_mark_cycles=args.timeline_mark_cycles,
    )
    options = RunOptions(
        max_restarts=restarts,
        grace=args.grace_period,
        stall_timeout=args.stall_timeout,
        elastic=elastic_settings,
        discovery_script=script,
        default_slots=env.discovered_host_slots(args.slots_per_host),
        dry_run=args.dry_run,
        horovod_elastic=args.horovod_elastic or in_process,
    )
    return spec, options


IN_PROCESS_GLOO_TIMEOUT = 120  # seconds; Horovod's default, 30, is shorter than a joining worker's start under load


def _job_env(given: dict[str, str], in_process: bool) -> dict[str, str]:
    return {**given, **(_in_process_env(given) if in_process else {})}


def _in_process_env(given: Mapping[str, str] | None = None) -> dict[str, str]:
    """What the ranks of ``--recovery in-process`` get: HVDKIT_RECOVERY, and a Gloo timeout of
    ``IN_PROCESS_GLOO_TIMEOUT`` s unless HOROVOD_GLOO_TIMEOUT_SECONDS is set (in the environment, or in
    ``given``: the job's ``-x`` variables): the ranks wait inside Gloo's rendezvous while a joining worker
    imports its framework and starts Horovod (5-37 s measured here under load); a rank that waits longer
    fails that rendezvous (engine fix 17: a failed reset, tried again; before it, the job was lost)."""
    out = {env.RECOVERY: "in-process"}
    if "HOROVOD_GLOO_TIMEOUT_SECONDS" not in os.environ and "HOROVOD_GLOO_TIMEOUT_SECONDS" not in (given or {}):
        out["HOROVOD_GLOO_TIMEOUT_SECONDS"] = str(IN_PROCESS_GLOO_TIMEOUT)
    return out


def _refuse_under_horovod_elastic(restarts_given: bool, interval_given: bool, flag: str) -> None:
    """ConfigError for an option of hvdkit's restart loop that Horovod's elastic driver (``flag``: --horovod-elastic
    or --recovery in-process) has no use for (it takes --timeline, --stall-timeout, --slots-per-host,
    --elastic-timeout, ...)."""
    if restarts_given:
        raise ConfigError(
            f"--max-restarts (or {env.MAX_RESTARTS}) does not apply with {flag}: Horovod's elastic "
            "driver does not restart the job, it goes on in the surviving workers after a failure; remove "
            f"--max-restarts and unset {env.MAX_RESTARTS}, or drop {flag} to have hvdkit restart the job from "
            "its checkpoints"
        )
    if interval_given:
        raise ConfigError(
            f"--discovery-interval (or {env.DISCOVERY_INTERVAL}) does not apply with {flag}: Horovod's "
            f"elastic driver runs the discovery script every second, which it does not let you change; remove "
            f"--discovery-interval and unset {env.DISCOVERY_INTERVAL}"
        )


def _cores() -> int:
    return len(os.sched_getaffinity(0))


def _elastic_settings(
    args: argparse.Namespace, num_proc: int, found: Sequence[Host], origin: str
) -> ElasticSettings | None:
    from ..core.options import check_positive_int
    from ..launcher.elastic import rules as elastic
    from ..launcher.elastic.discovery import ScriptDiscovery

    for flag, value in (("--min-np", args.min_np), ("--max-np", args.max_np)):
        if value is not None:
            check_positive_int(flag, value, "the fewest/most ranks an elastic job runs with")
    script = args.host_discovery_script
    if script:
        ScriptDiscovery(script).check()
    return elastic.settings_from(
        num_proc,
        args.min_np,
        args.max_np,
        script=script and os.path.abspath(script),
        hosts=found,
        origin=origin,
        interval=args.discovery_interval,
        timeout=args.elastic_timeout,
    )
