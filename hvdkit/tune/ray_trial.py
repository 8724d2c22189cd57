"""One trial of ``hvdkit tune --backend ray``: a Ray Tune ``Trainable`` that runs ``hvdkit run -np K``.

Ray places the trainable's actor in the trial's placement group (one bundle of K CPUs, and K GPUs
where the cluster has them, on one node); ``setup`` starts the trial's ``hvdkit run`` there as a
subprocess in its own process group (``LocalProcess``, the local backend's), ``step`` returns the
next epoch that rank 0 reported through ``hvdkit.tune.report`` (the same channel as the local
backend), and ``cleanup`` - what Ray calls when its scheduler stops or pauses the trial, or the run
ends - stops the job gracefully: SIGTERM to ``hvdkit run``, whose ranks checkpoint and exit; the
process group is killed only if it outlives ``kill_after`` seconds. Imports Ray: only the Ray
backend loads this module.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Any, TextIO

from ray import tune
from ray.tune.schedulers import MedianStoppingRule, TrialScheduler

from ..core import env as _env
from ..core.tune_channel import read_reports
from .config import substitute
from .outcome import EXITED, trial_outcome
from .runner import LocalProcess, TrialLaunch, tail
from .slots import local_cores

__all__ = ["HvdkitTrial", "MedianStop", "Progress", "TrialRecord", "EXIT_KEY", "KEY_OF"]

EXIT_KEY = "hvdkit_exit"  # in a trial's last result: the exit code of its hvdkit run (0: COMPLETE)
KEY_OF = "hvdkit_key"  # in every result: the trial's folder number (OUT/trials/NNNN)


def trial_key(out: str, trial_id: str) -> int:
    """The folder number (``OUT/trials/NNNN``) of the Ray trial ``trial_id``: the lowest free number,
    taken atomically (``mkdir``) at its first start and kept in ``OUT/trials/.ray/<trial_id>``, so a
    retried or resumed trial finds its folder (and its checkpoint) again."""
    ids = os.path.join(out, "trials", ".ray")
    os.makedirs(ids, exist_ok=True)
    known = os.path.join(ids, trial_id)
    if os.path.exists(known):
        with open(known, encoding="utf-8") as f:
            return int(f.read())
    key = 0
    while True:
        try:
            os.mkdir(os.path.join(out, "trials", f"{key:04d}"))
            break
        except FileExistsError:
            key += 1
    with open(known + ".tmp", "w", encoding="utf-8") as f:
        f.write(f"{key}\n")
    os.replace(known + ".tmp", known)
    return key


def known_key(out: str, trial_id: str) -> int | None:
    """The folder number ``trial_key`` gave ``trial_id``, None if it has not started."""
    try:
        with open(os.path.join(out, "trials", ".ray", trial_id), encoding="utf-8") as f:
            return int(f.read())
    except (OSError, ValueError):
        return None


class HvdkitTrial(tune.Trainable):
    """A trial whose training is ``hvdkit run -np K -- COMMAND --name value ...`` (see the module doc).

    ``setup_args`` (given by ``tune.with_parameters``): ``plan``, a dict with ``command`` (words, with
    ``{trial_dir}``/``{trial}``), ``space`` (the SearchSpace), ``metric``, ``num_proc``, ``run_flags``,
    ``out`` (absolute), ``cwd`` (the driver's working folder), ``env`` (variables for the job),
    ``poll`` and ``kill_after`` (seconds).
    """

    def setup(self, config: dict[str, Any], plan: dict[str, Any] | None = None) -> None:
        self.plan = plan or {}
        self.metric = self.plan["metric"]
        self.key = trial_key(self.plan["out"], self.trial_id)
        self.trial_dir = os.path.join(self.plan["out"], "trials", f"{self.key:04d}")
        # a retried attempt gets new files; the script resumes from the trial folder's checkpoint
        attempt = 1 + sum(n.startswith("attempt-") for n in os.listdir(self.trial_dir))
        space = self.plan["space"]
        params = {p.name: config[p.name] for p in space.params}
        command = substitute(self.plan["command"], self.trial_dir, self.key) + space.flags(params)
        launch = TrialLaunch(
            number=self.key,
            command=tuple(command),
            num_proc=self.plan["num_proc"],
            cores=tuple(local_cores()),  # Ray does not pin actors: the node's cores, as hvdkit run sees them
            log_path=os.path.join(self.trial_dir, f"attempt-{attempt:04d}.log"),
            report_path=os.path.join(self.trial_dir, f"reports-{attempt:04d}.jsonl"),
            run_flags=tuple(self.plan["run_flags"]),
            env=dict(self.plan["env"]),
        )
        self.launch = launch
        self.offset = 0
        self.epochs: dict[int, dict[str, float]] = {}
        self.relayed: set[int] = set()
        self.pending: list[int] = []
        os.chdir(self.plan["cwd"])  # Ray starts trainables in their own folder; the command's paths are relative
        self.job = LocalProcess(launch, self._job_env())
        self.exit_code: int | None = None

    def _job_env(self) -> dict[str, str]:
        env = dict(os.environ)
        if self.plan.get("drop_omp"):
            # Ray sets OMP_NUM_THREADS to the actor's CPUs (K); hvdkit reads it as threads per rank
            env.pop(_env.OMP_NUM_THREADS, None)
        return env

    def step(self) -> dict[str, Any]:
        """The next epoch with the metric, as a result; ``done`` with the job's exit code once it ended."""
        while True:
            code = self.job.poll()  # before reading: every report written before the exit is then read
            self._read()
            if self.pending:
                result = self._result(self.pending.pop(0))
                if code == 0 and not self.pending:  # the job's last epoch: the trial ends with it
                    result.update({EXIT_KEY: 0, "done": True})
                return result
            if code is not None:  # after the last epoch was relayed, or a failure
                return self._end(code)
            time.sleep(self.plan.get("poll", 0.2))

    def _read(self) -> None:
        records, self.offset = read_reports(self.launch.report_path, self.offset)
        for rec in records:
            epoch = rec["epoch"]
            self.epochs.setdefault(epoch, {}).update(rec["metrics"])
            if self.metric in rec["metrics"] and epoch not in self.relayed:
                self.relayed.add(epoch)
                self.pending.append(epoch)

    def _result(self, epoch: int) -> dict[str, Any]:
        return {**self.epochs[epoch], "epoch": epoch, KEY_OF: self.key}

    def _end(self, code: int) -> dict[str, Any]:
        self.exit_code = code
        output = tail(self.launch.log_path) if code != 0 else ""
        end = trial_outcome(code, self.epochs, self.metric, output=output, log=self.launch.log_path)
        if end.failed_attempt:  # Ray retries it (--retries) or records it FAIL; NaN is Ray's to judge
            command = "hvdkit run " if end.cause == EXITED else ""  # "trial 3: hvdkit run exit code 1; ..."
            raise RuntimeError(f"trial {self.key}: {command}{end.why}")
        # the job exited after its last epoch was relayed: that epoch again, now saying the job ended
        return {**self._result(max(self.relayed)), EXIT_KEY: 0, "done": True}

    def save_checkpoint(self, checkpoint_dir: str) -> dict[str, Any]:
        # the job's own checkpoint (in the trial folder) is the state; Ray keeps which epochs were relayed
        return {"relayed": sorted(self.relayed)}

    def load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        self.relayed.update(checkpoint.get("relayed", ()))

    def cleanup(self) -> None:
        """Ray stops the trial (pruned, paused, or the run ends): the preemption stop of its job."""
        job = getattr(self, "job", None)
        if job is None or job.poll() is not None:
            return
        job.stop()  # SIGTERM to hvdkit run: every rank checkpoints and exits
        deadline = time.monotonic() + self.plan.get("kill_after", 90.0)
        while job.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        if job.poll() is None:
            job.kill()


class MedianStop(MedianStoppingRule):
    """Ray's ``MedianStoppingRule``, continuing a trial where Ray's would pause it.

    Ray's rule pauses a trial ("yields time to other trials") when too few others have reached its
    epoch while some trial waits to start. Pausing an hvdkit trial stops its whole distributed job
    and restarts it later from its checkpoint; with ``max_concurrent_trials`` the waiting trial gets
    a slot when a trial ends anyway. So this rule continues instead, as Optuna's MedianPruner does.
    """

    def on_trial_result(self, tune_controller: Any, trial: Any, result: dict[str, Any]) -> str:
        decision = super().on_trial_result(tune_controller, trial, result)
        return TrialScheduler.CONTINUE if decision == TrialScheduler.PAUSE else decision


@dataclass
class TrialRecord:
    """What the driver saw of one Ray trial."""

    trial_id: str
    params: dict
    key: int | None = None
    started: float = 0.0
    ended: float = 0.0
    state: str = "RUNNING"
    epochs: dict = field(default_factory=dict)  # epoch -> the metric's value
    attempts: int = 1
    error: str = ""


class Progress(tune.Callback):
    """Prints one line per trial event and keeps the TrialRecords (the driver's view)."""

    def __init__(self, cfg: Any, out: str, stream: TextIO) -> None:
        self.cfg, self.out, self.stream, self.records = cfg, out, stream, {}

    def _say(self, line: str) -> None:
        self.stream.write(line + "\n")
        self.stream.flush()

    def on_trial_start(self, iteration, trials, trial, **info):
        params = {n: trial.config.get(n) for n in self.cfg.space.names()}
        rec = self.records.setdefault(trial.trial_id, TrialRecord(trial.trial_id, params))
        rec.started = rec.started or time.time()
        self._say(f"Ray trial {trial.trial_id} started: {_params(params)}")

    def on_trial_result(self, iteration, trials, trial, result, **info):
        rec = self._record(trial)
        rec.key = result.get(KEY_OF, rec.key)
        if self.cfg.metric in result:
            epoch = result.get("epoch", result["training_iteration"] - 1)
            rec.epochs[int(epoch)] = float(result[self.cfg.metric])
        if result.get(EXIT_KEY) == 0:
            rec.state = "COMPLETE"

    def _record(self, trial) -> TrialRecord:
        rec = self.records.setdefault(trial.trial_id, TrialRecord(trial.trial_id, {}))
        if rec.key is None:
            rec.key = known_key(self.out, trial.trial_id)
        return rec

    def on_trial_complete(self, iteration, trials, trial, **info):
        rec = self._record(trial)
        rec.ended = time.time()
        if rec.state != "COMPLETE":
            rec.state = "PRUNED"  # stopped by the scheduler before its job ended
        last = rec.epochs[max(rec.epochs)] if rec.epochs else None
        at = f" at epoch {max(rec.epochs)}" if rec.state == "PRUNED" and rec.epochs else ""
        self._say(
            f"trial {rec.key} {rec.state}{at} ({self.cfg.metric} {_fmt(last)}) in {rec.ended - rec.started:.1f} s"
        )

    def on_trial_recover(self, iteration, trials, trial, **info):
        rec = self._record(trial)
        rec.attempts += 1
        self._say(f"trial {rec.key} failed: retrying it (attempt {rec.attempts} of {self.cfg.retries + 1})")

    def on_trial_error(self, iteration, trials, trial, **info):
        rec = self._record(trial)
        rec.ended, rec.state = time.time(), "FAIL"
        self._say(f"trial {rec.key} FAIL after {rec.attempts} attempt(s) in {rec.ended - rec.started:.1f} s")


def _fmt(v: float | None) -> str:
    return "-" if v is None else f"{v:.6g}"


def _params(params: dict) -> str:
    return " ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in params.items())
