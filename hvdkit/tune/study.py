"""The driver of ``hvdkit tune``: ask Optuna for trials, run each as a distributed job, tell the outcome.

Up to ``parallel`` trials run at once, each ``hvdkit run -np K`` pinned to its own core group. The
driver reads each trial's reports as they come and asks the pruner after every epoch; a pruned trial
gets the preemption stop (SIGTERM to ``hvdkit run``: every rank checkpoints and exits) and is
recorded PRUNED. A failed attempt is recorded FAIL with the last lines of its output, and its
parameters are enqueued again as a new trial (same trial folder, so it resumes from the failed
attempt's checkpoint and starts with its reports), up to ``retries`` times; a parameter set that
fails every attempt ends the search, and so do ``max_failures`` failed attempts of any parameters.
The study is counted in COMPLETE + PRUNED trials, so running the same command again resumes it until
``trials`` are done. Several drivers (hosts, SLURM array tasks) may share one study through its
storage: each starts a trial only while the study's COMPLETE + PRUNED + RUNNING trials are fewer
than ``trials``, and gives a trial back unrun when trials asked before it already fill the study,
so together they finish exactly ``trials``. Imports Optuna.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from dataclasses import dataclass, field
from typing import Any, TextIO

from ..core.errors import ConfigError
from ..core.tune_channel import read_reports
from .config import EXIT_DONE, EXIT_FAILED, EXIT_INTERRUPTED, PLACEHOLDERS, TuneConfig, placeholder_note, substitute
from .outcome import COMPLETE, INTERRUPTED, PRUNED, trial_outcome
from .results import ATTEMPT_ATTR, ERROR_ATTR, KEY_ATTR, write_results
from .runner import LocalRunner, TrialJob, TrialLaunch, TrialRunner, tail
from .slots import SlotPool, local_cores, plan_slots
from .storage import import_optuna, make_pruner, make_sampler, open_storage
from .workers import JOB_ATTR, requeue_dead_local, this_worker

# TuneConfig, PLACEHOLDERS and the results' attributes are re-exported: this module offered them first
__all__ = ["TuneConfig", "run_study", "KEY_ATTR", "ATTEMPT_ATTR", "ERROR_ATTR", "PLACEHOLDERS"]


@dataclass
class _Running:
    trial: Any
    params: dict
    key: int
    attempt: int
    cores: tuple
    launch: TrialLaunch
    job: TrialJob
    started: float
    offset: int = 0
    epochs: dict = field(default_factory=dict)  # epoch -> {metric: value}
    reported: set = field(default_factory=set)
    pruned_at: int | None = None
    carried: list = field(default_factory=list)  # reports of earlier attempts of these parameters


class Driver:
    """Runs one ``hvdkit tune`` invocation on a study (see the module docstring)."""

    def __init__(self, cfg: TuneConfig, runner: TrialRunner | None = None, stream: TextIO | None = None) -> None:
        cfg.check()
        self.cfg = cfg
        self.optuna = import_optuna()
        self.runner = runner or LocalRunner()
        self.stream = stream or sys.stdout
        self.pool = SlotPool(plan_slots(cfg.parallel, cfg.num_proc, local_cores()))
        os.makedirs(os.path.join(cfg.out, "trials"), exist_ok=True)
        self.study = self._study()
        self.worker = this_worker()
        self.running: dict[int, _Running] = {}
        self.abort: str | None = None
        self.failures = 0  # failed attempts in this run (not interrupted ones)
        self.interrupted: int | None = None
        self.forced = False  # a second signal came: running trials are killed, not stopped
        self._last_status = time.monotonic()

    def _study(self):
        optuna, cfg = self.optuna, self.cfg
        direction = "minimize" if cfg.mode == "min" else "maximize"
        storage = open_storage(cfg.storage, cfg.out)
        try:
            before = len(optuna.load_study(study_name=cfg.study_name, storage=storage).get_trials(deepcopy=False))
        except KeyError:  # no such study yet
            before = 0
        study = optuna.create_study(
            storage=storage,
            study_name=cfg.study_name,
            direction=direction,
            sampler=make_sampler(cfg.seed, before),
            pruner=make_pruner(cfg.pruner, cfg.pruner_startup_trials, cfg.pruner_warmup_epochs),
            load_if_exists=True,
        )
        if study.direction.name.lower() != direction:
            raise ConfigError(
                f"study {cfg.study_name!r} {study.direction.name.lower()}s its metric, but --mode {cfg.mode} "
                "was given; give the study's mode, or a new --study NAME"
            )
        return study

    # -- counting -------------------------------------------------------------------------------------
    def counts(self) -> dict[str, int]:
        """``{state name: trials}`` of the whole study (all workers)."""
        out: dict[str, int] = {}
        for t in self.study.get_trials(deepcopy=False):
            out[t.state.name] = out.get(t.state.name, 0) + 1
        return out

    def done(self) -> int:
        c = self.counts()
        return c.get("COMPLETE", 0) + c.get("PRUNED", 0)

    def taken(self) -> int:
        """COMPLETE + PRUNED + RUNNING trials of the whole study: RUNNING ones run here or in another
        worker on the same storage (or in one that was killed while they ran)."""
        c = self.counts()
        return c.get("COMPLETE", 0) + c.get("PRUNED", 0) + c.get("RUNNING", 0)

    # -- the loop -------------------------------------------------------------------------------------
    def run(self) -> int:
        """Run trials until the study has ``trials`` COMPLETE + PRUNED ones; the exit code."""
        cfg = self.cfg
        for line in requeue_dead_local(self.study, self.optuna.trial.TrialState.FAIL, self.worker):
            self._say(line)
        done = self.done()
        self._say(
            f"study {cfg.study_name!r}: {done} of {cfg.trials} trials done; up to {cfg.parallel} at once, "
            f"{cfg.num_proc} rank(s) each; {cfg.mode}imize {cfg.metric}"
        )
        note = placeholder_note(cfg.command)
        if note:
            self._say(note)
        previous = {s: signal.signal(s, self._on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            while True:
                while self._may_start():
                    self._start()
                if not self.running:
                    break
                time.sleep(cfg.poll_interval)
                for number in list(self.running):
                    self._watch(self.running[number])
                self._status()
        finally:
            for r in self.running.values():  # only after an exception of our own: leave no trial behind
                r.job.kill()
            for s, h in previous.items():
                signal.signal(s, h)
        elsewhere = self.counts().get("RUNNING", 0)
        if self.abort is None and self.interrupted is None and elsewhere:
            self._say(
                f"{self.done()} of {cfg.trials} trials done here and elsewhere; {elsewhere} still RUNNING in other "
                "hvdkit tune workers on this study (results below are what is finished now)"
            )
        if self.interrupted is not None:
            self._say(f"interrupted by {signal.Signals(self.interrupted).name}: run the same command again to resume")
            return EXIT_INTERRUPTED
        if self.abort is not None:
            self._say(f"search ended: {self.abort}")
            return EXIT_FAILED
        return EXIT_DONE

    def _on_signal(self, signum, _frame):
        if self.interrupted is not None:  # a second signal: no more waiting
            self.forced = True
            for r in self.running.values():
                r.job.kill()
            return
        self.interrupted = signum
        for r in self.running.values():
            r.job.stop()

    def _may_start(self) -> bool:
        if self.abort or self.interrupted is not None or not self.pool.free():
            return False
        return self.taken() < self.cfg.trials

    def _too_late(self, trial: Any) -> bool:
        """True when trials asked before ``trial`` (finished or running, in any worker) already fill the
        study: another worker took its last trial between our count and our ask. ``trial`` is then
        recorded FAIL with that reason, unrun."""
        ahead = 0
        for t in self.study.get_trials(deepcopy=False):
            name = t.state.name
            ahead += name in ("COMPLETE", "PRUNED") or (name == "RUNNING" and t.number < trial.number)
        if ahead < self.cfg.trials:
            return False
        trial.set_user_attr(ERROR_ATTR, f"not run: {ahead} trials asked before it already fill the study")
        self.study.tell(trial, state=self.optuna.trial.TrialState.FAIL)
        return True

    def _start(self) -> None:
        cfg = self.cfg
        trial = self.study.ask()
        if self._too_late(trial):
            return
        params = cfg.space.suggest(trial)
        key = int(trial.user_attrs.get(KEY_ATTR, trial.number))
        attempt = int(trial.user_attrs.get(ATTEMPT_ATTR, 1))
        trial.set_user_attr(KEY_ATTR, key)
        trial.set_user_attr(ATTEMPT_ATTR, attempt)
        for name, value in self.worker.attrs().items():
            trial.set_user_attr(name, value)
        trial_dir = os.path.abspath(os.path.join(cfg.out, "trials", f"{key:04d}"))
        os.makedirs(trial_dir, exist_ok=True)
        cores = self.pool.take()
        launch = TrialLaunch(
            number=trial.number,
            command=tuple(substitute(cfg.command, trial_dir, key) + cfg.space.flags(params)),
            num_proc=cfg.num_proc,
            cores=cores,
            log_path=os.path.join(trial_dir, f"attempt-{trial.number:04d}.log"),
            report_path=os.path.join(trial_dir, f"reports-{trial.number:04d}.jsonl"),
            run_flags=cfg.run_flags,
        )
        try:
            job = self.runner.start(launch)
        except BaseException:
            self.pool.give(cores)
            self.study.tell(trial, state=self.optuna.trial.TrialState.FAIL)
            raise
        r = _Running(trial, params, key, attempt, cores, launch, job, time.monotonic())
        self.running[trial.number] = r  # at once: from here on the signal handler stops it with the others
        if self.interrupted is not None:  # a signal came while it was launched: the handler did not have it
            if self.forced:
                job.kill()
            else:
                job.stop()
        if isinstance(getattr(job, "pid", None), int):
            trial.set_user_attr(JOB_ATTR, job.pid)  # LocalProcess: the leader of its own process group
        r.carried = _earlier_reports(trial_dir, trial.number)
        again = f", attempt {attempt}" if attempt > 1 else ""
        self._say(f"trial {trial.number} started on core(s) {','.join(map(str, cores))}{again}: {_params(params)}")

    def _watch(self, r: _Running) -> None:
        try:
            self._watch_one(r)
        except (self.optuna.exceptions.UpdateFinishedTrialError, ValueError):  # ValueError: tell, "Cannot tell"
            state = next(t.state.name for t in self.study.get_trials(deepcopy=False) if t.number == r.trial.number)
            if state == "RUNNING":
                raise
            self._taken_over(r, state)

    def _taken_over(self, r: _Running, state: str) -> None:
        """Another worker ended ``r``'s trial (it took this one for gone) and reruns its parameters in the
        same trial folder: stop sharing it, say so in one line, go on."""
        if self.running.pop(r.trial.number, None) is not None:
            self.pool.give(r.cores)
        if r.job.poll() is None:
            r.job.kill()
        self._say(
            f"trial {r.trial.number}: another hvdkit tune worker on this study recorded it {state} while it ran here "
            f"(it took this worker for gone); dropped here (log: {r.launch.log_path})"
        )

    def _watch_one(self, r: _Running) -> None:
        code = r.job.poll()  # before reading: every report written before the exit is then read
        self._read(r)
        if code is None:
            stopped_at = getattr(r.job, "stopped_at", None)
            if stopped_at is not None and time.monotonic() - stopped_at > self.cfg.kill_after:
                r.job.kill()
            return
        del self.running[r.trial.number]
        self.pool.give(r.cores)
        self._finish(r, code)

    def _read(self, r: _Running) -> None:
        records, r.offset = read_reports(r.launch.report_path, r.offset)
        records, r.carried = r.carried + records, []
        for rec in records:
            epoch = rec["epoch"]
            r.epochs.setdefault(epoch, {}).update(rec["metrics"])
            value = rec["metrics"].get(self.cfg.metric)
            if value is None or epoch in r.reported or r.pruned_at is not None:
                continue
            r.reported.add(epoch)
            r.trial.report(float(value), epoch)
            if self.interrupted is None and r.trial.should_prune():
                r.pruned_at = epoch
                r.job.stop()  # the preemption path: every rank checkpoints and exits

    def _finish(self, r: _Running, code: int) -> None:
        took = time.monotonic() - r.started
        interrupted = None if self.interrupted is None else signal.Signals(self.interrupted).name
        output = tail(r.launch.log_path) if code != 0 else ""
        end = trial_outcome(
            code, r.epochs, self.cfg.metric, pruned_at=r.pruned_at, interrupted=interrupted, output=output
        )
        if end.state == PRUNED:
            self.study.tell(r.trial, state=self.optuna.trial.TrialState.PRUNED)
            at = f"at epoch {r.pruned_at} ({self._metric(end.value)})"
            self._say(f"trial {r.trial.number} PRUNED {at} in {took:.1f} s")
        elif end.state == COMPLETE:
            self.study.tell(r.trial, end.value)
            self._say(f"trial {r.trial.number} COMPLETE {self._metric(end.value)} in {took:.1f} s: {_params(r.params)}")
        else:
            self._fail(r, end.why, took)
            if end.cause == INTERRUPTED:  # the same attempt again, in the next run
                self.study.enqueue_trial(r.params, user_attrs={KEY_ATTR: r.key, ATTEMPT_ATTR: r.attempt})
            elif end.failed_attempt:
                self._failed_attempt(r)

    def _failed_attempt(self, r: _Running) -> None:
        """Count ``r``'s failure; retry its parameters, or end the search (``abort``) past the limits."""
        self.failures += 1
        if self.failures >= self.cfg.max_failures:
            if self.abort is None:
                self.abort = (
                    f"{self.failures} trials failed (--max-failures {self.cfg.max_failures}; last: trial "
                    f"{r.trial.number}, see {r.launch.log_path}); fix the script or its environment, or raise "
                    "--max-failures, and run the same command to resume"
                )
        elif r.attempt <= self.cfg.retries:
            self.study.enqueue_trial(r.params, user_attrs={KEY_ATTR: r.key, ATTEMPT_ATTR: r.attempt + 1})
            self._say(f"  retrying its parameters (attempt {r.attempt + 1} of {self.cfg.retries + 1})")
        elif self.abort is None:
            self.abort = (
                f"the parameters of trial {r.key} failed {r.attempt} time(s) (last: trial {r.trial.number}, see "
                f"{r.launch.log_path}); fix the script, or raise --retries, and run the same command to resume"
            )

    def _fail(self, r: _Running, why: str, took: float) -> None:
        r.trial.set_user_attr(ERROR_ATTR, why[-4000:])
        self.study.tell(r.trial, state=self.optuna.trial.TrialState.FAIL)
        first, _, rest = why.partition("\n")
        self._say(f"trial {r.trial.number} FAIL in {took:.1f} s: {first}")
        for line in rest.splitlines()[-8:]:
            self._say(f"  | {line}")

    def _metric(self, value: float | None) -> str:
        return f"{self.cfg.metric} {'-' if value is None else f'{value:.6g}'}"

    def _status(self, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._last_status < self.cfg.status_interval:
            return
        self._last_status = now
        c = self.counts()
        parts = []
        for r in self.running.values():
            last = max(r.epochs) if r.epochs else None
            where = f"epoch {last}" if last is not None else "starting"
            parts.append(f"trial {r.trial.number} {where} ({now - r.started:.0f} s)")
        self._say(
            f"[status] {c.get('COMPLETE', 0) + c.get('PRUNED', 0)}/{self.cfg.trials} done "
            f"({c.get('COMPLETE', 0)} complete, {c.get('PRUNED', 0)} pruned, {c.get('FAIL', 0)} failed); "
            f"running: {'; '.join(parts) or 'none'}"
        )

    def _say(self, line: str) -> None:
        self.stream.write(line + "\n")
        self.stream.flush()


def _earlier_reports(trial_dir: str, number: int) -> list[dict[str, Any]]:
    """The reports of the earlier attempts in ``trial_dir`` (a retry or a resumed trial starts from their
    checkpoint, so their epochs are this attempt's too; a later report of an epoch overrides)."""
    records = []
    for name in sorted(os.listdir(trial_dir)):
        if name.startswith("reports-") and name.endswith(".jsonl") and name != f"reports-{number:04d}.jsonl":
            records += read_reports(os.path.join(trial_dir, name))[0]
    return records


def _params(params: dict) -> str:
    return " ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in params.items())


def run_study(cfg: TuneConfig, runner: TrialRunner | None = None, stream: TextIO | None = None) -> int:
    """Run ``hvdkit tune`` for ``cfg``, then write its results (table, CSV, best.json, plots); the exit code."""
    driver = Driver(cfg, runner, stream)
    code = driver.run()
    write_results(driver.study, cfg, driver.stream)
    return code
