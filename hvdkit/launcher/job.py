"""Running a job to its end: ``run_job(spec, options)``, the one path of every ``hvdkit run``.

A job is a sequence of attempts, each one plain mpirun / horovodrun --gloo run of ``spec``
(``plan.build`` -> ``execute.Execution``). A fixed-size job relaunches the same hosts and size
after a failure, up to ``max_restarts`` times, and polls nothing (``FixedMembership``); an elastic
one (``options.elastic``) re-discovers its hosts between attempts and watches them during one
(``ElasticMembership``). Both go through ``attempts.run_attempts``: one attempt builder, one
restart loop, one summary, one exit rule. Usable from code as from the command line::

    from hvdkit.launcher import JobSpec, RunOptions, run_job
    code = run_job(JobSpec(command=["python", "train.py"], num_proc=2), RunOptions(max_restarts=1))
"""

from __future__ import annotations

import dataclasses
import os
import secrets
import shlex
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TextIO

from ..core import env
from . import execute, plan, remote, slurm_nodes
from .attempts import ElasticGaveUp, FixedMembership, run_attempts, world_size
from .elastic.discovery import FixedDiscovery, ScriptDiscovery
from .elastic.horovod_driver import build_horovod_elastic
from .elastic.loop import ElasticMembership, HostView
from .elastic.rules import ElasticSettings, choose_world
from .execute import JobResult
from .hosts import Host, format_hosts, mpirun_uses_srun, total_slots
from .spec import JobSpec

__all__ = ["RunOptions", "run_job", "exit_code", "host_check"]


@dataclass(frozen=True)
class RunOptions:
    """How ``run_job`` runs a JobSpec (the flags of ``hvdkit run`` that are not the job itself).

    ``max_restarts``: relaunches after failures; ``grace``: seconds the ranks get to checkpoint and
    exit after a stop; ``stall_timeout``: seconds a rank may stay out of a collective before the job
    ends naming it (HVDKIT_STALL_TIMEOUT for the ranks; None: their default); ``elastic``:
    ElasticSettings for --min-np/--max-np (None: fixed size); ``discovery_script``: the host
    discovery script of an elastic job (None: ``spec.hosts`` are fixed), a host it lists without
    ``:slots`` having ``default_slots``; ``dry_run``: print the plan and start nothing;
    ``horovod_elastic``: run ``elastic`` under Horovod's own elastic driver (one horovodrun job that
    keeps its surviving processes; for ``hvd.elastic.run`` scripts) instead of by restarts.
    """

    max_restarts: int = env.DEFAULT_MAX_RESTARTS
    grace: float = env.DEFAULT_GRACE_PERIOD
    stall_timeout: float | None = None
    elastic: ElasticSettings | None = None
    discovery_script: str | None = None
    default_slots: int = 1
    dry_run: bool = False
    horovod_elastic: bool = False


def run_job(
    spec: JobSpec,
    options: RunOptions = RunOptions(),
    *,
    err: TextIO | None = None,
    environ: Mapping[str, str] | None = None,
) -> int:
    """Run ``spec`` to its end as ``options`` say; the exit code (``exit_code`` of the last attempt).

    Every attempt is ``spec`` with HVDKIT_RESTART (the attempt, 0 first) and HVDKIT_WORLD_SIZE set
    for its ranks; an elastic attempt runs at its own size and hosts, with HVDKIT_MEMBERSHIP_CHANGES
    and HVDKIT_LINEAGE too. Raises LaunchError when a host cannot be reached before the start, and
    ElasticGaveUp (a LaunchError) after printing the summary when too few slots stayed.
    """
    err = err or sys.stderr
    environ = os.environ if environ is None else environ
    if options.horovod_elastic:
        return _run_horovod_elastic(spec, options, err)
    attempts = _Attempts(spec, options, err)
    if options.dry_run:
        return attempts.dry_run()

    def say(text: str) -> None:
        err.write(f"hvdkit run: {text}\n")
        err.flush()

    elastic = options.elastic
    if elastic:
        view = HostView(attempts.source(), check=host_check(spec.controller, environ))
        membership = ElasticMembership(elastic, view, log=say)
    else:
        if not (spec.controller == "mpi" and mpirun_uses_srun(environ)):  # in SLURM, mpirun reaches nodes by srun
            remote.check_reachable(spec.hosts)  # an unreachable host is an error before anything starts
        membership = FixedMembership(spec.hosts, spec.num_proc)
    started = time.time()
    try:
        history, final = run_attempts(membership, attempts.launch, options.max_restarts, log=say)
    except ElasticGaveUp as e:
        for line in e.history.summary() if e.history.attempts else ():
            say(line)
        raise
    for line in history.summary(final, elastic=bool(elastic)):
        say(line)
    if final.interrupted_by is not None and final.exit_code == 0:
        say(
            f"stopped by {execute.signal_name(final.interrupted_by)}: every rank exited cleanly "
            f"(exit code {exit_code(final)})"
        )
    if spec.timeline and os.path.exists(spec.timeline) and os.path.getmtime(spec.timeline) >= started - 1:
        say(f"timeline written; summarise it: hvdkit timeline {shlex.quote(spec.timeline)}")
    return exit_code(final)


# --recovery in-process: a host left out (its worker failed while discovery did not list it, or it failed 3 times
# in 300 s: engine fix 09) comes back after 2-3 s, then 4-5 s, ... at most 60 s; Horovod's default is never.
IN_PROCESS_COOLDOWN = (1, 60)


def _run_horovod_elastic(spec: JobSpec, options: RunOptions, err: TextIO) -> int:
    """``hvdkit run --horovod-elastic`` (or ``--recovery in-process``): one horovodrun job in Horovod's elastic
    mode; its exit code. horovodrun refuses one fixed host (``-H localhost:2``) in elastic mode: that host is
    listed by a discovery script written for the job instead (a lost worker is replaced there, engine fix 09)."""
    with tempfile.TemporaryDirectory(prefix="hvdkit-discovery-") as folder:
        script = options.discovery_script
        if script is None and len(spec.hosts) == 1:
            script = os.path.join(folder, "discover.sh")
            with open(os.open(script, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o700), "w") as f:
                f.write(f"#!/bin/sh\necho {shlex.quote(format_hosts(spec.hosts))}\n")
            spec = dataclasses.replace(spec, hosts=())
        if spec.env.get(env.RECOVERY) == "in-process":
            # one lineage for every worker (the checkpoint lock knows its own job), and a job id that tags the workers'
            # reports of where they run (a stop reaches one on another host) and that the stop's ssh command checks
            ids = {env.LINEAGE: secrets.token_hex(8), env.JOB_ID: secrets.token_hex(8)}
            spec = dataclasses.replace(spec, env={**ids, **spec.env})
        built = build_horovod_elastic(
            spec,
            options.elastic,
            script,
            stall_timeout=options.stall_timeout,
            slots_per_host=options.default_slots,
            blacklist_cooldown=IN_PROCESS_COOLDOWN if spec.env.get(env.RECOVERY) == "in-process" else None,
        )
        if options.dry_run:
            print(" ".join(shlex.quote(a) for a in built.argv))
            return 0
        return _run_elastic_driver(built, spec, options, err)


def _run_elastic_driver(built: plan.Plan, spec: JobSpec, options: RunOptions, err: TextIO) -> int:
    bounds = f"{options.elastic.min_np}..{options.elastic.max_np} ranks"
    if spec.env.get(env.RECOVERY) == "in-process":
        err.write(
            f"hvdkit run: in-process recovery ({bounds}, Horovod's elastic driver over Gloo): the ranks left after a "
            "lost worker go back to their last in-memory commit and go on in the same processes; a new worker "
            "joins at the next commit\n"
        )
    else:
        err.write(
            f"hvdkit run: Horovod's elastic driver runs this job ({bounds}): a worker or host that goes is dropped "
            "and the others go on from the last state.commit(), in the same processes; hvdkit's restarts and "
            "checkpoints are not used\n"
        )
    err.flush()
    # hvdkit's ranks (in-process) stop cleanly on SIGTERM, so a stop reaches them at once; horovodrun itself gets
    # it only when the grace period ends (it then gives its workers 5 s before it kills them)
    in_process = spec.env.get(env.RECOVERY) == "in-process"
    final = execute.Execution(
        built, job_id=spec.env.get(env.JOB_ID), grace=options.grace, forward_usr1=False, elastic_workers=in_process
    ).run()
    if final.interrupted_by is not None and final.exit_code == 0:
        err.write(
            f"hvdkit run: stopped by {execute.signal_name(final.interrupted_by)}: every rank exited cleanly "
            f"(exit code {exit_code(final)})\n"
        )
    return exit_code(final)


def exit_code(result: JobResult) -> int:
    """The exit code of a job whose last attempt ended with ``result``: that attempt's, except that a
    job stopped by a signal to the launcher, every rank having exited cleanly, ends as the signal's
    default action would (128 + signal), as shells and schedulers expect."""
    if result.interrupted_by is not None and result.exit_code == 0:
        return 128 + result.interrupted_by
    return result.exit_code


def host_check(
    controller: str, environ: Mapping[str, str] | None = None
) -> Callable[[Iterable[Host], float], dict[str, str]]:
    """How an elastic job tells which hosts are up: inside a SLURM allocation, where mpirun reaches
    the nodes through srun, SLURM's own node states (no ssh between nodes needed, as for fixed-size
    jobs); elsewhere, and for Gloo (horovodrun starts remote ranks over ssh), an ssh check.
    Env: SLURM_JOBID."""
    environ = os.environ if environ is None else environ
    if controller == "mpi" and mpirun_uses_srun(environ):
        return slurm_nodes.unavailable
    return remote.unreachable


class _Attempts:
    """Builds each attempt of one job: its JobSpec, Plan and Execution."""

    def __init__(self, spec: JobSpec, options: RunOptions, err: TextIO) -> None:
        self.spec, self.options, self.err = spec, options, err
        self.is_root, self.cores = os.geteuid() == 0, len(os.sched_getaffinity(0))
        self.lineage = secrets.token_hex(8)  # the same for every attempt: the checkpoint lock knows its own job

    def spec_of(
        self,
        world: tuple[Host, ...] | None = None,
        size: int | None = None,
        attempt: int | None = None,
        changes: int = 0,
    ) -> JobSpec:
        """``spec`` as attempt ``attempt`` runs it with ``size`` ranks (``attempts.world_size``) on
        ``world`` after ``changes`` membership changes (no attempt: as a dry run of a fixed-size job shows it)."""
        base = dict(self.spec.env)
        if self.options.stall_timeout:
            base[env.STALL_TIMEOUT] = f"{self.options.stall_timeout:g}"
        if attempt is None:
            return dataclasses.replace(self.spec, env=base)
        if self.options.elastic is None:
            extra = {env.RESTART: str(attempt), env.WORLD_SIZE: str(size)}
            return dataclasses.replace(self.spec, env={**base, **extra})
        extra = {
            env.RESTART: str(attempt),
            env.WORLD_SIZE: str(size),
            env.MEMBERSHIP_CHANGES: str(changes),
            env.LINEAGE: self.lineage,
        }
        return dataclasses.replace(self.spec, num_proc=size, hosts=world, env={**base, **extra})

    def launch(self, world: tuple[Host, ...], size: int, attempt: int, changes: int) -> execute.Execution:
        """Attempt ``attempt`` (0 first) of ``size`` ranks on ``world``, ready to run: an ``execute.Execution``."""
        job_id = secrets.token_hex(8)  # tags the reports of this attempt's rank wrappers
        if self.options.elastic is not None:
            self.err.write(f"hvdkit run: attempt {attempt + 1}: {size} rank(s) on {format_hosts(world)}\n")
            self.err.flush()
        built = plan.build(
            self.spec_of(world, size, attempt, changes),
            job_id=job_id,
            progress=self.err.isatty(),
            **self._plan_options(),
        )
        return execute.Execution(
            built, job_id=job_id, grace=self.options.grace, forward_usr1=self.spec.controller == "mpi"
        )

    def _plan_options(self) -> dict:
        """What ``plan.build`` needs besides the spec and the attempt: the same for a run and a dry run."""
        return {"is_root": self.is_root, "cores": self.cores, "here": remote.is_this_machine}

    def source(self) -> ScriptDiscovery | FixedDiscovery:
        """Where an elastic job's hosts come from: its discovery script, else the fixed ``spec.hosts``."""
        script = self.options.discovery_script
        if script:
            return ScriptDiscovery(script, default_slots=self.options.default_slots)
        return FixedDiscovery(self.spec.hosts, self.options.elastic.discovery)

    def dry_run(self) -> int:
        """Print what the first attempt would run (and, elastic, the settings and hosts now); 0."""
        settings = self.options.elastic
        if settings is None:
            print(" ".join(shlex.quote(a) for a in plan.build(self.spec_of(), **self._plan_options()).argv))
            return 0
        listed = self.source().hosts()
        world = choose_world(listed, settings, first=True)
        print(settings.describe())
        print(
            f"hosts now: {format_hosts(listed) or 'none'} ({total_slots(listed)} slot(s)); world sizes allowed: "
            f"{settings.min_np}..{settings.max_np}; --max-restarts {self.options.max_restarts} after failures"
        )
        if world is None:
            print(f"first launch: waits for {settings.min_np} slot(s)")
            return 0
        size = world_size(world)
        print(f"first launch: {size} rank(s) on {format_hosts(world)}:")
        built = plan.build(self.spec_of(world, size, 0, 0), **self._plan_options())
        print(" ".join(shlex.quote(a) for a in built.argv))
        return 0
