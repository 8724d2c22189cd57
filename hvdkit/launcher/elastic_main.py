"""``hvdkit run --min-np/--max-np``: plan, dry-run and run an elastic job (the CLI's elastic half)."""

import dataclasses
import os
import secrets
import shlex
import sys

from ..core import env
from . import execute, plan, remote, slurm_nodes
from .elastic.discovery import FixedDiscovery, ScriptDiscovery
from .elastic.rules import choose_world
from .elastic.loop import ElasticGaveUp, HostView, run_elastic
from .hosts import format_hosts, mpirun_uses_srun, total_slots

__all__ = ["main"]


def main(spec, settings, *, script, restarts, grace, dry_run, is_root, cores, err=None, default_slots=1):
    """Run ``spec`` elastically (``settings``); the exit code. ``script`` is the discovery script or
    None (then ``spec.hosts`` are the fixed hosts); a host it lists without ``:slots`` has
    ``default_slots``. With ``dry_run`` print the plan and start nothing.

    Every attempt is ``spec`` at that attempt's size and hosts, with HVDKIT_RESTART (the attempt,
    0 first), HVDKIT_WORLD_SIZE and HVDKIT_MEMBERSHIP_CHANGES set for its ranks.
    Raises ElasticGaveUp (a LaunchError) after printing the summary when too few slots stayed.
    """
    err = err or sys.stderr
    lineage = secrets.token_hex(8)  # the same for every attempt: the checkpoint lock knows its own job
    source = ScriptDiscovery(script, default_slots=default_slots) if script else FixedDiscovery(spec.hosts, settings.discovery)

    def attempt_plan(world, attempt, changes, job_id=None):
        size = total_slots(world)
        extra = {env.RESTART: str(attempt), env.WORLD_SIZE: str(size), env.MEMBERSHIP_CHANGES: str(changes),
                 env.LINEAGE: lineage}  # fmt: skip
        attempt_spec = dataclasses.replace(spec, num_proc=size, hosts=world, env={**spec.env, **extra})
        return plan.build(attempt_spec, is_root=is_root, cores=cores, job_id=job_id, progress=err.isatty() if job_id else None)

    if dry_run:
        return _dry_run(source, settings, restarts, attempt_plan)

    def say(text):
        err.write(f"hvdkit run: {text}\n")
        err.flush()

    def launch(world, attempt, changes, stop):
        job_id = secrets.token_hex(8)
        say(f"attempt {attempt + 1}: {total_slots(world)} rank(s) on {format_hosts(world)}")
        built = attempt_plan(world, attempt, changes, job_id)
        return execute.run(built, job_id=job_id, grace=grace, forward_usr1=spec.controller == "mpi", stop=stop)

    try:
        history, final = run_elastic(settings, HostView(source, check=host_check(spec.controller)), launch, restarts, log=say)
    except ElasticGaveUp as e:
        for line in e.history.summary() if e.history.attempts else ():
            say(line)
        raise
    for line in history.summary():
        say(line)
    if final.interrupted_by is not None and final.exit_code == 0:
        return 128 + final.interrupted_by
    if final.exit_code != 0:
        say(final.message)
    return final.exit_code


def host_check(controller, environ=None):
    """How an elastic job tells which hosts are up: inside a SLURM allocation, where mpirun reaches
    the nodes through srun, SLURM's own node states (no ssh between nodes needed, as for fixed-size
    jobs); elsewhere, and for Gloo (horovodrun starts remote ranks over ssh), an ssh check.
    Env: SLURM_JOBID."""
    environ = os.environ if environ is None else environ
    if controller == "mpi" and mpirun_uses_srun(environ):
        return slurm_nodes.unavailable
    return remote.unreachable


def _dry_run(source, settings, restarts, attempt_plan):
    listed = source.hosts()
    world = choose_world(listed, settings, first=True)
    print(settings.describe())
    print(f"hosts now: {format_hosts(listed) or 'none'} ({total_slots(listed)} slot(s)); world sizes allowed: "
          f"{settings.min_np}..{settings.max_np}; --max-restarts {restarts} after failures")  # fmt: skip
    if world is None:
        print(f"first launch: waits for {settings.min_np} slot(s)")
        return 0
    print(f"first launch: {total_slots(world)} rank(s) on {format_hosts(world)}:")
    print(" ".join(shlex.quote(a) for a in attempt_plan(world, 0, 0).argv))
    return 0
