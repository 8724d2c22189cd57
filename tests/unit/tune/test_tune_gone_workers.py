"""A worker killed with SIGKILL leaves its trials RUNNING in the shared study. A driver that starts on the
same host records those of a gone worker whose job has ended FAIL and queues their parameters again
(same key and attempt); it leaves alone a trial whose job still runs (naming its process group), and
those of a living worker, of another host, or of another PID namespace on this host (a container with
the same host name, whose pids mean nothing here). A worker whose pid now names a process that started
at another time (a reused pid) is gone. Records are compared with what /proc says, read here."""

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
from dataclasses import replace

import pytest

from hvdkit.tune.results import ATTEMPT_ATTR, KEY_ATTR
from hvdkit.tune.workers import (
    JOB_ATTR,
    PROCESS_ATTR,
    WORKER_ATTR,
    WorkerId,
    is_gone,
    process_start,
    requeue_dead_local,
    this_worker,
)

optuna = pytest.importorskip("optuna")
HOST = socket.gethostname()


def _dead_pid():
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()  # reaped: no process has this id now (ids are not reused this soon)
    return p.pid


def _proc(pid):
    """What /proc says of ``pid`` of this PID namespace: boot id, namespace inode, start time (field 22)."""
    with open("/proc/sys/kernel/random/boot_id") as f:
        boot = f.read().strip()
    with open(f"/proc/{pid}/stat") as f:
        start = int(f.read().rpartition(")")[2].split()[19])
    return {"boot": boot, "pidns": os.stat("/proc/self/ns/pid").st_ino, "start": start}


def _running(study, worker, job=None, process=None):
    t = study.ask({"lr": optuna.distributions.FloatDistribution(0.01, 0.1)})
    t.suggest_float("lr", 0.01, 0.1)
    t.set_user_attr(KEY_ATTR, t.number)
    t.set_user_attr(ATTEMPT_ATTR, 1)
    t.set_user_attr(WORKER_ATTR, worker)
    if process is not None:
        t.set_user_attr(PROCESS_ATTR, process)
    if job is not None:
        t.set_user_attr(JOB_ATTR, job)
    return t


def test_only_a_gone_local_workers_trials_whose_job_ended_are_failed_and_queued_again(tmp_path):
    study = optuna.create_study(storage=f"sqlite:///{tmp_path}/s.db", study_name="s")
    dead = _dead_pid()
    job = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        gone = _running(study, f"{HOST}:{dead}", job=_dead_pid())
        outlived = _running(study, f"{HOST}:{dead}", job=job.pid)
        living = _running(study, f"{HOST}:{os.getppid()}")
        remote = _running(study, f"another-{HOST}:{dead}")
        lines = requeue_dead_local(study, optuna.trial.TrialState.FAIL)
    finally:
        os.killpg(job.pid, signal.SIGKILL)
        job.wait()
    states = {t.number: t.state.name for t in study.get_trials()}
    assert states[gone.number] == "FAIL"
    assert [states[t.number] for t in (outlived, living, remote)] == ["RUNNING"] * 3
    (queued,) = [t for t in study.get_trials() if t.state.name == "WAITING"]
    assert (queued.user_attrs[KEY_ATTR], queued.user_attrs[ATTEMPT_ATTR]) == (gone.number, 1)
    again = study.ask()  # the queued trial, with the gone trial's parameters
    assert again.number == queued.number
    assert again.suggest_float("lr", 0.01, 0.1) == study.get_trials()[gone.number].params["lr"]
    assert lines == [
        f"trial {gone.number} was RUNNING in worker {HOST}:{dead}, which is gone: recorded FAIL, parameters queued",
        f"trial {outlived.number}: its worker {HOST}:{dead} is gone but its job (process group {job.pid}) still "
        f"runs; left RUNNING: end it (kill -TERM -{job.pid}) and run again to rerun its parameters",
    ]


def test_a_worker_in_another_pid_namespace_is_left_alone_and_one_whose_pid_was_reused_is_gone(tmp_path):
    study = optuna.create_study(storage=f"sqlite:///{tmp_path}/s.db", study_name="s")
    parent = os.getppid()  # alive while this test runs
    ours = _proc(parent)
    elsewhere = _running(study, f"{HOST}:{_dead_pid()}", process={**ours, "pidns": ours["pidns"] + 1})
    other_machine = _running(study, f"{HOST}:{_dead_pid()}", process={**ours, "boot": "another-boot-id"})
    reused = _running(study, f"{HOST}:{parent}", process={**ours, "start": ours["start"] + 1}, job=_dead_pid())
    living = _running(study, f"{HOST}:{parent}", process=ours)
    lines = requeue_dead_local(study, optuna.trial.TrialState.FAIL)
    states = {t.number: t.state.name for t in study.get_trials()}
    assert [states[t.number] for t in (elsewhere, other_machine, reused, living)] == [
        "RUNNING",
        "RUNNING",
        "FAIL",
        "RUNNING",
    ]
    assert lines == [
        f"trial {reused.number} was RUNNING in worker {HOST}:{parent}, which is gone: recorded FAIL, parameters queued"
    ]


def test_liveness_is_judged_only_in_this_pid_namespace_on_this_host():
    here = this_worker()
    assert (here.host, here.pid) == (HOST, os.getpid())
    assert {"boot": here.boot, "pidns": here.pidns, "start": here.start} == _proc(os.getpid())
    parent, dead = os.getppid(), _dead_pid()
    born = process_start(parent)
    assert born == _proc(parent)["start"] and process_start(dead) is None
    cases = {
        "another PID namespace, a pid that is not here": (replace(here, pid=dead, pidns=here.pidns + 1), False),
        "another machine with this host name": (replace(here, pid=dead, boot="another-boot-id"), False),
        "another host name": (replace(here, host=f"another-{HOST}", pid=dead), False),
        "this namespace, pid gone": (replace(here, pid=dead), True),
        "this namespace, pid reused (another start time)": (replace(here, pid=parent, start=born + 1), True),
        "this namespace, alive": (replace(here, pid=parent, start=born), False),
        "this very process": (here, False),
        "an earlier process with this pid": (replace(here, start=here.start - 1), True),
        "a record without namespace and start, pid gone": (WorkerId(HOST, dead), True),
        "a record without namespace and start, pid alive": (WorkerId(HOST, parent), False),
    }
    assert {k: is_gone(w, here) for k, (w, _) in cases.items()} == {k: gone for k, (_, gone) in cases.items()}


INNER = """
import json, os, subprocess, sys
with open("/proc/sys/kernel/ns_last_pid", "w") as f:  # the next process of this namespace gets pid PID
    f.write(str(int(sys.argv[1]) - 1))
code = "import json, sys; from hvdkit.tune.workers import this_worker; "
code += "print(json.dumps(this_worker().attrs()), flush=True); sys.stdin.read()"
sys.exit(subprocess.run([sys.executable, "-c", code]).returncode)
"""


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("unshare"), reason="needs root and unshare")
def test_a_live_worker_in_a_second_pid_namespace_with_a_pid_that_is_gone_here_keeps_its_trial(tmp_path):
    dead = _dead_pid()
    argv = ["unshare", "--pid", "--fork", "--mount-proc", sys.executable, "-c", INNER, str(dead)]
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        attrs = json.loads(proc.stdout.readline())
        study = optuna.create_study(storage=f"sqlite:///{tmp_path}/s.db", study_name="s")
        t = _running(study, attrs[WORKER_ATTR], process=attrs[PROCESS_ATTR])
        assert attrs[WORKER_ATTR] == f"{HOST}:{dead}"  # a pid no process has here
        assert attrs[PROCESS_ATTR]["pidns"] != os.stat("/proc/self/ns/pid").st_ino
        lines = requeue_dead_local(study, optuna.trial.TrialState.FAIL)
        assert lines == [] and study.get_trials()[t.number].state.name == "RUNNING"
    finally:
        proc.stdin.close()  # the worker in the namespace ends, and the namespace with it
        assert proc.wait(timeout=30) == 0
