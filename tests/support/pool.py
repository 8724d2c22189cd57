"""A pool of long-lived 2-rank jobs that distributed tests send their cases to (issue 38).

A job costs seconds to start (mpirun or horovodrun, then torch or TensorFlow and Horovod on every
rank) and a contract milliseconds to check, so one job per (launcher, framework) is started the
first time a test asks for it and serves every case of that test module (tests/conftest.py ends the
jobs after a module's last test: an idle job keeps its ranks busy in Horovod's background loop and
MPI's progress, up to 88 % of a core, which the other modules' tests would lose). A case is an
importable function and JSON-able keyword arguments (``"torch_contracts:main", {"out_dir": ...}``),
run on every rank by tests/support/pool_worker.py; ``run_case`` returns each rank's return value,
or fails the test with the failing rank's traceback.

A case that does not finish within its bound fails naming the ranks still running it (with their
Python stacks), one that kills a rank fails naming it; either way the pool ends that job (its
process group and its ranks', by pid, never by name) and the next case gets a fresh job. A failed
case retires its job the same way, as does a case that leaves what the worker cannot put back.
``park_all`` (run by tests/conftest.py after each module) stops every job's ranks with SIGSTOP, so an idle
job costs no CPU (Horovod's background loop and MPI's progress kept an idle job's ranks busy, up to 88 %
of a core), and the next module that asks for the same launcher and framework wakes it (SIGCONT) instead
of paying for a fresh start; Gloo's per-operation timeout is raised for pool jobs so that an operation
stopped mid-wait is not timed out by the time it spent stopped. ``close_all`` (when the session
finishes) ends every job. A session that ends before it (an interrupt, a killed pytest worker) leaves nothing
either: pool_reaper.py, started with the first job, holds every job process by a pidfd and ends what is
left when this process's end closes its stdin (parked ranks stayed stopped for good before).

Use the pool where the job is not the subject; a test of start-up, the launcher, exit codes, env
read at ``init`` or a process's memory starts its own job (helpers.run_ranks).
"""

import atexit
import itertools
import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

from helpers import BIN, PYTHON, launcher_argv, pid_running

WORKER = Path(__file__).resolve().parent / "pool_worker.py"
REAPER = Path(__file__).resolve().parent / "pool_reaper.py"
FRAMEWORKS = ("torch", "keras")
SIZE = 2
START_BOUND_S = 240  # mpirun + TensorFlow + Horovod on a loaded 2-core machine: well under this
STOP_GRACE_S = 15
POLL_S = 0.02
PARKED_GLOO_TIMEOUT_S = 24 * 3600


class PoolCaseError(AssertionError):
    """A case failed on a rank, hung, or ended its job (the message names the ranks)."""


def _tail(path, chars=4000):
    try:
        return path.read_text(errors="replace")[-chars:]
    except OSError:
        return ""


def _first_to_exit(launcher_log):
    """The rank the launcher says ended first (Open MPI: "The first process to do so was: ... [[job,1],R]";
    horovodrun: "Process R exit with status code C."), or None."""
    found = re.search(r"first process to do so was:\s+Process name: \[\[\d+,\d+\],(\d+)\]", launcher_log)
    found = found or re.search(r"Process (\d+) exit with status code [1-9]", launcher_log)
    return int(found.group(1)) if found else None


def _kill_group(pgid):
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass


class Rank:
    """One rank process of a pool job, held by a pidfd opened when it said it was ready: every signal goes
    through the pidfd, so it reaches that process or nothing. The ranks are not this process's children, and
    a job's ranks can die between two modules while its launcher still runs: a signal by pid number then
    reached whatever process the kernel gave that number next (the suite starts thousands of processes
    and threads, and pid_max is 32768 here). A SIGSTOP of a park so stopped a unit test's child, which then
    ignored its SIGTERM for good."""

    def __init__(self, pid, pgid):
        self.pid, self.pgid = pid, pgid
        try:
            self.fd = os.pidfd_open(pid)
        except ProcessLookupError:  # it ended before we looked: nothing to hold, nothing to signal
            self.fd = None

    def running(self):
        """True while the process is there and not a zombie (its pid number is not reused while it is)."""
        if self.fd is None:
            return False
        try:
            signal.pidfd_send_signal(self.fd, 0)
        except ProcessLookupError:
            return False
        return pid_running(self.pid)  # a zombie holds its number: /proc/<pid> is still this process

    def signal(self, sig):
        """Send ``sig`` to this process; False (and nothing sent) once it has ended."""
        if self.fd is None:
            return False
        try:
            signal.pidfd_send_signal(self.fd, sig)
        except ProcessLookupError:
            return False
        return True

    def close(self):
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def _wait_until_ranks_gone(ranks, bound):
    deadline = time.monotonic() + bound
    while any(rank.running() for rank in ranks) and time.monotonic() < deadline:
        time.sleep(0.05)


class Job:
    """One 2-rank pool job: its launcher process (own process group), its ranks, its next case number."""

    _ids = itertools.count()

    def __init__(self, launcher, framework):
        self.launcher, self.framework = launcher, framework
        self.dir = Path(tempfile.mkdtemp(prefix=f"hvdkit-pool-{framework}-{launcher}-"))
        self.cases = 0
        self.ranks = {}  # rank -> Rank
        self.parked = False
        env = {k: v for k, v in os.environ.items() if not k.startswith("HVDKIT_")}  # each case brings its own
        env.update(PYTHONUNBUFFERED="1", PATH=f"{BIN}{os.pathsep}{env.get('PATH', '')}")
        # a parked job's background loop may be stopped inside a Gloo operation: the time it spends stopped
        # must not count against that operation (a case that hangs is bounded by run()'s timeout instead)
        env["HOROVOD_GLOO_TIMEOUT_SECONDS"] = str(PARKED_GLOO_TIMEOUT_S)
        argv = launcher_argv(launcher, SIZE) + [PYTHON, str(WORKER), str(self.dir), framework]
        self.log = open(self.dir / "launcher.log", "w")  # noqa: SIM115 (closed in end())
        self.proc = subprocess.Popen(
            argv, stdout=self.log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env, start_new_session=True
        )
        STARTED.append(self)
        _reap_if_orphaned(self.proc.pid, leader=True, folder=self.dir)

    def __repr__(self):
        return f"pool job {self.framework} under {self.launcher} (pid {self.proc.pid})"

    def wait_ready(self):
        """Wait until every rank has started Horovod; PoolCaseError if the job dies or takes too long."""
        deadline = time.monotonic() + START_BOUND_S
        while len(self.ranks) < SIZE:
            for r in range(SIZE):
                path = self.dir / f"ready.rank{r}.json"
                if r not in self.ranks and path.exists():
                    ready = json.loads(path.read_text())
                    self.ranks[r] = Rank(ready["pid"], ready["pgid"])
                    if ready["pgid"] != self.proc.pid:  # horovodrun --gloo: a session of its own per rank
                        _reap_if_orphaned(ready["pgid"], leader=True)
                    _reap_if_orphaned(ready["pid"], leader=ready["pid"] == ready["pgid"])
            if self.proc.poll() is not None or time.monotonic() > deadline:
                logs = self.logs()
                self.end()
                raise PoolCaseError(f"{self!r} did not start (ranks ready: {sorted(self.ranks)}):\n{logs}")
            time.sleep(POLL_S)

    def logs(self):
        """The launcher's and every rank's output, last lines."""
        parts = [f"--- launcher:\n{_tail(self.dir / 'launcher.log')}"]
        parts += [f"--- rank {r}:\n{_tail(self.dir / f'rank{r}.log')}" for r in range(SIZE)]
        return "\n".join(parts)

    def run(self, case, timeout):
        """Send one case and wait for every rank's result: ``(results by rank, retire reason or None)``."""
        n, target = self.cases, case["target"]
        self.cases += 1
        tmp = self.dir / f"case-{n}.tmp"
        tmp.write_text(json.dumps(case))
        os.replace(tmp, self.dir / f"case-{n}.json")
        deadline = time.monotonic() + timeout
        results, gone = {}, []
        while len(results) < SIZE:
            for r in range(SIZE):
                path = self.dir / f"case-{n}.rank{r}.json"
                if r not in results and path.exists():
                    results[r] = json.loads(path.read_text())
            if len(results) == SIZE:
                break
            gone = gone or [r for r, rank in self.ranks.items() if r not in results and not rank.running()]
            if gone or self.proc.poll() is not None:
                self._wait_for_launcher(5.0)  # its word on which rank ended first, the rank's last words
                missing, logs = [r for r in range(SIZE) if r not in results], self.logs()
                first = _first_to_exit(_tail(self.dir / "launcher.log", 20000))
                gone = [first] if first is not None else gone
                self.end()
                raise PoolCaseError(
                    f"case {target} ended its job: rank(s) {gone or missing} exited before reporting "
                    f"(no result from rank(s) {missing}); {self!r} ended, the next case gets a fresh job\n{logs}"
                )
            if time.monotonic() > deadline:
                missing = [r for r in range(SIZE) if r not in results]
                stacks = self._stacks_of(missing)
                self.end()
                raised = "".join(
                    f"\n--- rank {r} raised (the others may wait for it):\n{res['traceback']}"
                    for r, res in sorted(results.items())
                    if not res["ok"]
                )
                raise PoolCaseError(
                    f"case {target} did not finish within {timeout} s on rank(s) {missing} (hang?); "
                    f"{self!r} ended, the next case gets a fresh job{raised}\n{stacks}"
                )
            time.sleep(POLL_S)
        retire = [res["retire"] for res in results.values() if res.get("retire")]
        return [results[r] for r in range(SIZE)], "; ".join(retire) or None

    def _signal_ranks(self, sig):
        for rank in self.ranks.values():
            rank.signal(sig)

    def park(self):
        """Stop the ranks (SIGSTOP) until the next case wants this job: idle, they would keep a core busy."""
        if not self.parked and self.proc.poll() is None:
            self._signal_ranks(signal.SIGSTOP)
            self.parked = True

    def wake(self):
        """Let a parked job's ranks run again (SIGCONT)."""
        if self.parked:
            self._signal_ranks(signal.SIGCONT)
            self.parked = False

    def _wait_for_launcher(self, bound):
        try:
            self.proc.wait(bound)
        except subprocess.TimeoutExpired:
            pass

    def _stacks_of(self, ranks):
        """Every Python thread's stack on each of ``ranks`` (faulthandler, on SIGUSR2), with its log."""
        for r in ranks:
            self.ranks[r].signal(signal.SIGUSR2)
        time.sleep(1.0)
        return self.logs()

    def end(self, grace=0.0):
        """End the job: ask the ranks to stop and wait ``grace`` s, then kill its process group and ranks."""
        self.wake()  # a stopped rank can neither stop by itself nor leave its zombie to be reaped
        if grace and self.proc.poll() is None:
            (self.dir / "stop").write_text("")
            try:
                self.proc.wait(grace)
            except subprocess.TimeoutExpired:
                pass
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
        for rank in self.ranks.values():  # horovodrun --gloo starts its ranks in sessions of their own
            if rank.running():  # the group it leads lives while it does
                if rank.pgid not in (os.getpgrp(), self.proc.pid):
                    _kill_group(rank.pgid)
                rank.signal(signal.SIGKILL)
        self.proc.wait()
        _wait_until_ranks_gone(self.ranks.values(), 30)
        for rank in self.ranks.values():
            rank.close()
        self.log.close()
        if self in LIVE.values():
            del LIVE[(self.launcher, self.framework)]
        shutil.rmtree(self.dir, ignore_errors=True)


_REAPER: list = []  # the pool_reaper.py process of this session, once a job was started


def _reap_if_orphaned(pid, leader, folder=None):
    """Have pool_reaper.py end ``pid`` (and the group it leads), and remove ``folder``, should this process end
    before ``close_all``."""
    if not _REAPER:
        _REAPER.append(
            subprocess.Popen([PYTHON, str(REAPER)], stdin=subprocess.PIPE, text=True, start_new_session=True, bufsize=1)
        )
    _REAPER[0].stdin.write(f"{pid} {int(leader)}\n")
    if folder is not None:
        _REAPER[0].stdin.write(f"dir {folder}\n")


def _close_reaper():
    """Close the reaper's stdin (it ends what is left, nothing after close_all) and wait for it."""
    while _REAPER:
        reaper = _REAPER.pop()
        reaper.stdin.close()
        reaper.wait(30)


LIVE: dict = {}  # (launcher, framework) -> the Job serving it now
STARTED: list = []  # every Job started this session (for the summary and for close_all)
CASES: list = []  # every case sent this session


def job_for(launcher, framework):
    """The live job for ``launcher`` and ``framework``, started (and waited for) when there is none."""
    if framework not in FRAMEWORKS:
        raise ValueError(f"framework must be one of {FRAMEWORKS} (got {framework!r})")
    job = LIVE.get((launcher, framework))
    if job is None or job.proc.poll() is not None:
        if job is not None:
            job.end()
        job = LIVE[(launcher, framework)] = Job(launcher, framework)
        job.wait_ready()
    job.wake()
    return job


def case_env(env=None):
    """The HVDKIT_* variables a case runs with: this process's (as a fresh job would inherit them), plus ``env``."""
    return {**{k: v for k, v in os.environ.items() if k.startswith("HVDKIT_")}, **(env or {})}


def run_case(launcher, framework, target, params=None, timeout=300, env=None, fresh=False, args=()):
    """Run ``target`` (``"module:function"``, a module under tests/distributed/workers, tests/support or
    tests) with ``**params`` on every rank of the pool job for ``launcher`` and ``framework``; each
    rank's return value, by rank (``args``: positional arguments before ``params``). ``env``: variables set for this case only (HVDKIT_* of this process
    too). ``fresh``: the case runs in a job no other case has used or will use.

    Fails the test (PoolCaseError) with the failing ranks' tracebacks, or naming the ranks that hung
    past ``timeout`` s or died; any failure ends the job, so the next case starts a fresh one.
    """
    if fresh and (launcher, framework) in LIVE and LIVE[(launcher, framework)].cases:
        LIVE[(launcher, framework)].end(STOP_GRACE_S)
    job = job_for(launcher, framework)
    CASES.append(target)
    results, retire = job.run(
        {"target": target, "args": list(args), "params": params or {}, "env": case_env(env)}, timeout
    )
    failed = [r for r, res in enumerate(results) if not res["ok"]]
    if failed or retire or fresh:
        job.end(STOP_GRACE_S)
    if failed:
        tracebacks = "\n".join(f"--- rank {r} of {job!r}:\n{results[r]['traceback']}" for r in failed)
        raise PoolCaseError(f"case {target} failed on rank(s) {failed}:\n{tracebacks}")
    return [res["value"] for res in results]


def run_worker(launcher, framework, worker, out, *args, timeout=300):
    """A contract worker's ``main(out, *args)`` run as a pool case; every rank's ``out/rank<r>.json``, by rank
    (what ``helpers.run_contract_worker`` returns for a job of its own)."""
    run_case(launcher, framework, f"{worker}:main", args=[str(out), *args], timeout=timeout)
    return [json.loads((Path(out) / f"rank{r}.json").read_text()) for r in range(SIZE)]


def park_all():
    """Stop every live job's ranks until a later case wakes it (after each test module)."""
    for job in LIVE.values():
        job.park()


def close_all():
    """End every pool job (at the end of the session): ask each to stop, then kill what remains."""
    for job in list(LIVE.values()):
        job.end(STOP_GRACE_S)
    for job in STARTED:
        if job.proc.returncode is None:
            job.end()
    _close_reaper()


def summary():
    """One line for the end of the session: jobs started, cases run."""
    kinds = sorted({f"{job.framework}/{job.launcher}" for job in STARTED})
    return f"pool: {len(STARTED)} job(s) started ({', '.join(kinds)}), {len(CASES)} case(s) run"


atexit.register(close_all)  # also when the session ends without pytest's hooks (an internal error)


def mode_results(launcher, framework, worker, np_, out, mode, timeout):
    """Per-rank JSON results (``<mode>-rank<r>.json`` under ``out``) of ``worker`` (a path; its module's
    ``main(out, mode)`` is the case) in ``mode``: at ``SIZE`` ranks a case of the pool's ``framework`` job
    under ``launcher``; at another size (a 1-rank resume) a job of its own."""
    from helpers import run_ranks

    if np_ == SIZE:
        run_case(launcher, framework, f"{Path(worker).stem}:main", args=[str(out), mode], timeout=timeout)
    else:
        proc = run_ranks(launcher, np_, [str(worker), str(out), mode], timeout=timeout)
        assert proc.returncode == 0, f"{launcher} {mode} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    return [json.loads((Path(out) / f"{mode}-rank{r}.json").read_text()) for r in range(np_)]
