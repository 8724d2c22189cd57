"""A worker killed with SIGKILL leaves its trials RUNNING in the shared study. A driver that starts on the
same host records those of a gone worker whose job has ended FAIL and queues their parameters again
(same key and attempt); it leaves alone a trial whose job still runs (naming its process group), and
those of a living worker or of another host."""

import os
import signal
import socket
import subprocess
import sys

import pytest

from hvdkit.tune.results import ATTEMPT_ATTR, KEY_ATTR
from hvdkit.tune.workers import JOB_ATTR, WORKER_ATTR, requeue_dead_local

optuna = pytest.importorskip("optuna")
HOST = socket.gethostname()


def _dead_pid():
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()  # reaped: no process has this id now (ids are not reused this soon)
    return p.pid


def _running(study, worker, job=None):
    t = study.ask({"lr": optuna.distributions.FloatDistribution(0.01, 0.1)})
    t.suggest_float("lr", 0.01, 0.1)
    t.set_user_attr(KEY_ATTR, t.number)
    t.set_user_attr(ATTEMPT_ATTR, 1)
    t.set_user_attr(WORKER_ATTR, worker)
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
