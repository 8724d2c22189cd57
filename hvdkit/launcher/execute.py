"""The one place that starts processes: run a Plan, stream rank-tagged output, report the outcome."""

import dataclasses
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass

from ..core import env as _env
from .plan import Plan
from .quiet import OutputFilter
from .rank_output import LineDemux, RankReports, retag
from .rankwrap import die_with_parent

__all__ = ["JobResult", "LineDemux", "RankReports", "local_rank_pids", "remote_rank_pids", "remote_ranks_to_stop", "remote_term_command", "run", "retag",
           "signal_name"]

# Horovod's stall inspector lists missing ranks as "1: [tensor, ...]"; "1!:" once past the shutdown time.
_STALLED = re.compile(r"^\[rank \d+\] (\d+)!: \[(.*)\]")


@dataclass(frozen=True)
class JobResult:
    """How a job ended."""

    exit_code: int
    failed_rank: int | None = None
    exit_status: int | None = None  # the failing rank's own exit code
    signal: int | None = None  # or the signal that killed it
    seconds: float = 0.0
    message: str = ""
    stalled_ranks: tuple = ()  # ranks Horovod's stall inspector found missing from collectives
    interrupted_by: int | None = None  # a signal the launcher itself received and passed on
    stop_reason: str | None = None  # why the launcher asked the ranks to stop (a StopRequest), if it did
    ranks_started_at: float | None = None  # time.monotonic() when the last rank reported its start
    failure_noticed_at: float | None = None  # time.monotonic() when the first failure report arrived
    resumed_step: int | None = None  # the step the ranks resumed at, if they report steps (PreemptionGuard)
    last_step: int | None = None  # the last step they reported
    guarded: bool = False  # the ranks reported through a PreemptionGuard (they can stop when asked)
    stopped_as_asked: bool = False  # and said they stop because asked (not that they finished)
    saved_step: int | None = None  # the newest step rank 0 reported checkpointed


def local_rank_pids(started, job_id, host=None):
    """Pids of this job's rank wrappers on this host that are still running, from their start reports.

    A pid counts only if its report names this host and the process with that pid here is a rank
    wrapper started for ``job_id`` (its HVDKIT_JOB_ID): never a rank of another job, a pid of
    another host, or a pid reused since.
    """
    host = host or socket.gethostname()
    return [
        rec["pid"]
        for rec in started.values()
        if rec.get("host") == host and isinstance(rec.get("pid"), int) and _is_wrapper_of(rec["pid"], job_id)
    ]


def _is_wrapper_of(pid, job_id):
    if pid <= 1 or not job_id:
        return False
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            if b"hvdkit.launcher.rankwrap" not in f.read():
                return False
        with open(f"/proc/{pid}/environ", "rb") as f:  # readable for our own processes (and root)
            return f"{_env.JOB_ID}={job_id}".encode() in f.read().split(b"\0")
    except OSError:
        return False


def remote_rank_pids(started, host=None):
    """``[(host, pid)]`` of this job's rank wrappers on other hosts, by rank, from their start reports."""
    host = host or socket.gethostname()
    return [(rec["host"], rec["pid"]) for _, rec in sorted(started.items())
            if rec.get("host") not in (None, host) and isinstance(rec.get("pid"), int) and rec["pid"] > 1]  # fmt: skip


def remote_ranks_to_stop(remote, local, guarded):
    """Which remote ranks (``[(host, pid)]``, by rank) a graceful stop signals over ssh.

    Ranks that train under a PreemptionGuard (``guarded``) stop together once any one of them got the
    signal (its check is a collective): then the local ranks' signal is enough, or, with no rank on
    this host, the first remote one. Signalling more would race: ssh delivers late and unevenly, and
    a rank that already stopped and is exiting dies of the signal instead of exiting cleanly.
    Unguarded ranks all get it (their default action ends them)."""
    if not guarded:
        return list(remote)
    return [] if local else list(remote[:1])


def remote_term_command(pid, job_id):
    """The shell command that sends SIGTERM to ``pid`` on its host if, and only if, it is a rank
    wrapper of ``job_id`` (its environment holds HVDKIT_JOB_ID=``job_id``): never a reused pid."""
    return (f"tr '\\0' '\\n' < /proc/{int(pid)}/environ 2>/dev/null | grep -qxF {shlex.quote(f'{_env.JOB_ID}={job_id}')} "
            f"&& kill -TERM {int(pid)}")


def _signal_remote(ranks, job_id, ssh=None):
    """SIGTERM to each rank wrapper of ``ranks`` (``[(host, pid)]``) over ssh, all hosts at once, in the
    background: horovodrun passes no signal on, so under Gloo this is how ranks on other hosts hear of
    a stop (mpirun passes SIGUSR1 on instead). The wrapper passes it to its command."""
    if not ranks or not job_id:
        return None
    from .remote import ssh as remote_ssh

    run_ssh = ssh or remote_ssh

    def send():
        for host, pid in ranks:
            threading.Thread(target=run_ssh, args=(host, ["sh", "-c", shlex.quote(remote_term_command(pid, job_id))], 15),
                             daemon=True).start()  # fmt: skip

    thread = threading.Thread(target=send, daemon=True)
    thread.start()
    return thread


def _signal_pids(pids, sig):
    for pid in pids:
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def signal_name(num):
    try:
        return signal.Signals(num).name
    except ValueError:
        return f"signal {num}"


def _outcome(returncode, statuses, seconds, stalled=(), interrupted_by=None, started=None):
    failures = [r for r in statuses.values() if r.get("exit_code") != 0]
    extra = {"seconds": seconds, "stalled_ranks": tuple(stalled), "interrupted_by": interrupted_by}
    if not failures:
        # A stop sent to the whole job (SLURM's scancel signals mpirun too): every rank that started
        # ended cleanly, so the launcher's own status says nothing more.
        stopped_cleanly = interrupted_by is not None and started and set(started) <= set(statuses)
        if returncode == 0 or stopped_cleanly:
            return JobResult(0, **extra)
        return JobResult(
            returncode or 1,
            message=f"the launcher exited with {returncode} before any rank reported a failure (see its output above)",
            **extra,
        )
    first = min(failures, key=lambda r: r["ended"])
    rank, sig, code = first["rank"], first.get("signal"), first.get("exit_code")
    how = f"was killed by {signal_name(sig)}" if sig else f"exited with code {code}"
    exit_code = 128 + sig if sig else code
    message = f"rank {rank} {how} on {first.get('host', '?')} after {first.get('seconds', 0):.1f} s; job stopped"
    if stalled:
        names = ", ".join(f"rank {r}" for r in stalled)
        message = f"{names} stopped taking part in collectives (Horovod's stall inspector gave up waiting); " + message
    if interrupted_by:
        message = f"stopped by {signal_name(interrupted_by)} sent to the launcher; " + message
    return JobResult(exit_code, rank, code, sig, message=message, **extra)


def run(plan: Plan, job_id=None, out=None, err=None, grace=30.0, forward_usr1=True, stop=None):
    """Start ``plan``, stream every rank's output tagged with its rank, return a JobResult.

    ``job_id`` is the HVDKIT_JOB_ID the plan gave its rank wrappers: their reports (pid, how each
    rank ended) are taken from the stream, not shown. A SIGTERM, SIGINT or SIGHUP (a closed
    terminal or ssh session; unless ignored, as under nohup) sent to the launcher is a graceful
    stop: the ranks on this host get SIGTERM directly from their wrappers (and, with
    ``forward_usr1``, mpirun passes SIGUSR1 to every rank, also on other hosts; without it, as under
    horovodrun, ranks on other hosts get SIGTERM over ssh, by the pid and host they reported), so a
    PreemptionGuard can checkpoint the current step. After ``grace`` seconds, or at a second
    signal, the launcher itself is terminated. Afterwards no rank process of this job is left on
    this host. If this process dies without a word (SIGKILL, its process group killed), mpirun or
    horovodrun gets SIGTERM from the kernel and ends the job on every host. ``stop`` (a
    ``hvdkit.launcher.elastic_run.StopRequest``) lets another thread ask for the same graceful stop,
    or a hard one; the result names its reason.
    """
    out = out or sys.stdout
    err = err or sys.stderr
    # HVDKIT_LOG_LEVEL=DEBUG shows the ranks' start-up chatter and the launcher's own failure report
    quiet = OutputFilter(verbose=_env.read_choice(_env.LOG_LEVEL, _env.LOG_LEVELS, _env.DEFAULT_LOG_LEVEL, upper=True) == "DEBUG")
    start = time.perf_counter()
    proc = subprocess.Popen(
        list(plan.argv),
        env=plan.full_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        start_new_session=True,  # a Ctrl-C in the terminal reaches the launcher only; it decides
        preexec_fn=_end_with(os.getpid()),
        text=True,
        errors="replace",
        bufsize=1,
    )
    reports = RankReports(job_id)
    received, timers = [], []

    def local_ranks():
        return local_rank_pids(reports.started, job_id)

    def stop_now():
        _signal_pids(local_ranks(), signal.SIGTERM)
        try:
            os.killpg(proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass

    stopping = []  # a graceful stop is under way (a signal or a StopRequest)

    def graceful():
        stopping.append(True)
        _signal_pids(local_ranks(), signal.SIGTERM)
        if forward_usr1:
            _signal_pids([proc.pid], signal.SIGUSR1)
        else:  # horovodrun passes no signal to other hosts: tell their ranks over ssh
            remote = remote_rank_pids(reports.started)
            _signal_remote(remote_ranks_to_stop(remote, local_ranks(), reports.training), job_id)
        timers.append(threading.Timer(grace, stop_now))
        timers[-1].daemon = True
        timers[-1].start()

    def forward(signum, _frame):
        received.append(signum)
        if len(received) > 1 or stopping:
            stop_now()
            return
        graceful()

    finished = threading.Event()

    def on_request():
        while not finished.is_set():
            if stop.wait(0.2):
                if stop.hard:  # mpirun and its ssh to a vanished host wait forever: kill them all
                    _signal_pids(local_ranks(), signal.SIGTERM)
                    _signal_pids(_tree(proc.pid), signal.SIGKILL)
                elif not (received or stopping):
                    graceful()
                return

    if stop is not None:
        threading.Thread(target=on_request, daemon=True).start()

    stops = [signal.SIGINT, signal.SIGTERM]
    if signal.getsignal(signal.SIGHUP) != signal.SIG_IGN:  # nohup: the user asked to outlive the terminal
        stops.append(signal.SIGHUP)
    previous = {s: signal.signal(s, forward) for s in stops}
    demux = LineDemux()
    stalled = []
    broken = set()  # streams the user can no longer read (a closed terminal)

    def write(lines):
        for stream, text in lines:
            record = reports.take(text)
            if record and stop is not None:
                stop.ranks_started_at, stop.last_step, stop.training = reports.last_start, reports.last_step, reports.training
                stop.resumed_step = reports.resume_point()
            if record:
                if record["event"] == "start" and stopping:  # started after the stop: stop it too
                    _signal_pids(local_rank_pids({0: record}, job_id), signal.SIGTERM)
                    if not forward_usr1 and not reports.training:
                        _signal_remote(remote_rank_pids({0: record}), job_id)
                continue
            m = _STALLED.match(text)
            if m and int(m.group(1)) not in stalled:
                stalled.append(int(m.group(1)))
            show(quiet.feed(stream, text))

    def show(lines):
        for stream, text in lines:
            target = out if stream == "stdout" else err
            if target in broken:
                continue
            try:
                target.write(text)
                target.flush()
            except OSError:  # keep draining the ranks' output: a full pipe would stall them
                broken.add(target)

    try:
        for physical in proc.stdout:
            write(demux.feed(physical))
        write(demux.flush())
        returncode = proc.wait()
    finally:
        finished.set()
        for timer in timers:  # the job is over: never signal a pid that may be reused
            timer.cancel()
        for s, handler in previous.items():
            signal.signal(s, handler)
        _reap(proc.pid, local_ranks())
    seconds = time.perf_counter() - start
    result = _outcome(returncode, reports.ended, seconds, stalled, received[0] if received else None, reports.started)
    show(quiet.end(rank_failed=result.failed_rank is not None))
    return dataclasses.replace(
        result,
        stop_reason=stop.reason if stop is not None and stop.is_set() and not received else None,
        ranks_started_at=reports.last_start,
        failure_noticed_at=reports.first_failure,
        resumed_step=reports.resume_point(),
        last_step=reports.last_step,
        guarded=reports.training,
        stopped_as_asked=reports.stopping,
        saved_step=reports.saved_step,
    )


def _end_with(launcher_pid):
    """For the launched mpirun/horovodrun: get SIGTERM when the launcher dies, however it dies.

    Both end the whole job on a SIGTERM, on every host; it reaches them although they run in
    their own session, where no signal to the launcher's process group or terminal does. Their
    output then has no reader: writing it must fail (EPIPE), not kill mpirun mid-way through
    ending the job (SIGPIPE), which would leave its session folder behind.
    """

    def arm():
        signal.signal(signal.SIGPIPE, signal.SIG_IGN)
        die_with_parent(signal.SIGTERM)
        if os.getppid() != launcher_pid:  # the launcher died before the request took effect
            os.kill(os.getpid(), signal.SIGKILL)

    return arm


def _tree(pid):
    """``pid`` and every process below it (ssh clients run in sessions of their own), from /proc."""
    children = {}
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    found, todo = [], [pid]
    while todo:
        found.append(todo.pop())
        todo += children.get(found[-1], [])
    return found


def _reap(pgid, rank_pids):
    """Kill whatever the job left behind on this host: the launcher's group and any rank wrapper
    still running (their commands die with them)."""
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    _signal_pids(rank_pids, signal.SIGKILL)
