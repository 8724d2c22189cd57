"""``hvdkit tune --backend ray``: the same trials on a Ray cluster, through Ray Tune.

Each trial is a placement group of one bundle of K (``-np``) CPUs - and K GPUs where the cluster
has GPUs - on one node (``STRICT_PACK``); its trainable (``ray_trial.HvdkitTrial``) runs ``hvdkit run
-np K -- COMMAND --name value ...`` there and relays rank 0's ``hvdkit.tune.report`` epochs to Ray.
The search is Optuna's TPE sampler through ``ray.tune.search.optuna.OptunaSearch`` on the same space;
``--pruner median|asha|none`` becomes Ray's ``MedianStoppingRule``/``ASHAScheduler``/FIFO; a trial a
scheduler stops gets the preemption stop (its ranks checkpoint and exit) and is recorded PRUNED;
``--trials``/``--parallel`` are ``num_samples``/``max_concurrent_trials``; ``--retries`` is Ray's
``max_failures``. The results are the local backend's: the table, ``trials.csv``, ``best.json`` and
the plots, from an Optuna study that holds what Ray ran. Without ``--ray-address``, hvdkit tune starts
a local Ray with this machine's cores and shuts it down at the end. Imports Ray (``hvdkit[ray]``).
"""

from __future__ import annotations

import datetime
import os
import sys
import time
from dataclasses import dataclass
from typing import Any, TextIO

from ..core import env as _env
from ..core.errors import ConfigError, MissingDependencyError
from .config import EXIT_DONE, EXIT_FAILED, EXIT_INTERRUPTED, TuneConfig, placeholder_note
from .results import ATTEMPT_ATTR, ERROR_ATTR, KEY_ATTR, write_results
from .slots import local_cores, plan_slots
from .space import SearchSpace
from .storage import import_optuna

__all__ = ["run_ray_study", "import_ray", "scheduler_for", "trial_resources"]


def import_ray() -> Any:
    """The ``ray`` module with Ray Tune; MissingDependencyError naming the extra without it."""
    try:
        import ray
        import ray.tune  # noqa: F401 - ray[tune]'s part
    except ImportError as e:
        raise MissingDependencyError(
            f"hvdkit tune --backend ray needs Ray Tune ({e}): pip install 'hvdkit[ray]' (or run 'make setup')"
        ) from None
    return ray


def scheduler_for(cfg: TuneConfig) -> Any:
    """Ray's trial scheduler for ``--pruner``: median -> MedianStoppingRule (``ray_trial.MedianStop``: never
    pauses a trial; a trial is stopped when its
    best value by epoch t is worse than the median of the other trials' running means up to t, once
    ``--pruner-startup-trials`` others (at least 1) got there, not before epoch ``--pruner-warmup-epochs``);
    asha -> ASHAScheduler (rungs at 1, 3, 9, ... epochs, keep the best third: Optuna's
    SuccessiveHalvingPruner's settings); none -> FIFO. Time is Ray's ``training_iteration``: one per
    reported epoch."""
    from ray.tune.schedulers import ASHAScheduler, FIFOScheduler

    from .ray_trial import MedianStop

    if cfg.pruner == "median":
        return MedianStop(
            time_attr="training_iteration",
            grace_period=cfg.pruner_warmup_epochs + 1,
            min_samples_required=max(1, cfg.pruner_startup_trials),
            hard_stop=True,
        )
    if cfg.pruner == "asha":
        return ASHAScheduler(time_attr="training_iteration", grace_period=1, reduction_factor=3, max_t=10**6)
    if cfg.pruner == "none":
        return FIFOScheduler()
    raise ConfigError(f"--pruner must be one of median, asha, none (got {cfg.pruner!r})")


def trial_resources(num_proc: int, cluster: dict[str, float]) -> list[dict[str, float]]:
    """The placement group bundles of one trial: one bundle of K CPUs (+ K GPUs where the cluster has
    GPUs), so the trial's ranks share a node and its actor sees all of the trial's GPUs."""
    bundle = {"CPU": float(num_proc)}
    if cluster.get("GPU", 0) >= 1:
        bundle["GPU"] = float(num_proc)
    return [bundle]


@dataclass(frozen=True)
class DefineByRun:
    """OptunaSearch's space: the SearchSpace's own ``suggest`` (the local backend's distributions);
    a picklable object, as Ray saves the searcher with it."""

    space: SearchSpace

    def __call__(self, trial: Any) -> None:
        self.space.suggest(trial)


class RayStudy:
    """One ``hvdkit tune --backend ray`` invocation (see the module docstring)."""

    def __init__(self, cfg: TuneConfig, address: str | None, stream: TextIO) -> None:
        cfg.check()
        self.cfg, self.address, self.stream = cfg, address, stream
        self.ray = import_ray()
        self.optuna = import_optuna()
        if address is None:
            self.cores = local_cores()
            plan_slots(cfg.parallel, cfg.num_proc, self.cores)  # the local backend's check and message
        self.out = os.path.abspath(cfg.out)
        os.makedirs(os.path.join(self.out, "trials"), exist_ok=True)

    def run(self) -> tuple[int, Any]:
        """Start (or join) Ray, run the trials, shut a local Ray down; ``(exit code, results study)``."""
        ray = self.ray
        started = False
        if self.address is None:
            ray.init(
                address="local",
                num_cpus=len(self.cores),
                include_dashboard=False,
                log_to_driver=False,
                logging_level="WARNING",
                configure_logging=True,
            )
            started = True
        else:
            ray.init(address=self.address, log_to_driver=False, logging_level="WARNING")
        try:
            where = f"a local Ray ({len(self.cores)} CPUs)" if started else f"the Ray cluster at {self.address}"
            self._say(
                f"study {self.cfg.study_name!r} on {where}: {self.cfg.trials} trials, up to {self.cfg.parallel} at "
                f"once, {self.cfg.num_proc} rank(s) each; {self.cfg.mode}imize {self.cfg.metric}"
            )
            note = placeholder_note(self.cfg.command)
            if note:
                self._say(note)
            return self._fit()
        finally:
            if started:
                ray.shutdown()

    def _fit(self) -> tuple[int, Any]:
        from ray import tune
        from ray.tune.search.optuna import OptunaSearch

        from .ray_trial import HvdkitTrial, Progress

        cfg, ray = self.cfg, self.ray
        cluster = ray.cluster_resources()
        self._check_fits(cluster)
        bundles = trial_resources(cfg.num_proc, cluster)
        if "GPU" in bundles[0]:
            self._say(f"each trial gets {cfg.num_proc} GPU(s) of the cluster's {int(cluster['GPU'])}")
        env = {_env.NUM_THREADS: "1"} if _env.NUM_THREADS not in os.environ else {}
        plan = {
            "command": list(cfg.command),
            "space": cfg.space,
            "metric": cfg.metric,
            "num_proc": cfg.num_proc,
            "run_flags": list(cfg.run_flags),
            "out": self.out,
            "cwd": os.getcwd(),
            "env": env,  # one CPU of the bundle per rank: one thread each unless the user said otherwise
            "drop_omp": _env.OMP_NUM_THREADS not in os.environ,
            "poll": cfg.poll_interval,
            "kill_after": cfg.kill_after,
        }
        trainable = tune.with_resources(
            tune.with_parameters(HvdkitTrial, plan=plan),
            tune.PlacementGroupFactory(bundles, strategy="STRICT_PACK"),
        )
        sampler = self.optuna.samplers.TPESampler(seed=cfg.seed)
        search = OptunaSearch(space=DefineByRun(cfg.space), metric=cfg.metric, mode=cfg.mode, sampler=sampler)
        progress = Progress(cfg, self.out, self.stream)
        tuner = tune.Tuner(
            trainable,
            tune_config=tune.TuneConfig(
                metric=cfg.metric,
                mode=cfg.mode,
                search_alg=search,
                scheduler=scheduler_for(cfg),
                num_samples=cfg.trials,
                max_concurrent_trials=cfg.parallel,
            ),
            run_config=tune.RunConfig(
                name=cfg.study_name,
                storage_path=os.path.join(self.out, "ray"),
                failure_config=tune.FailureConfig(max_failures=cfg.retries),
                callbacks=[progress],
                verbose=0,
            ),
        )
        grid = _quiet_fit(tuner)
        errors = {}
        for result in grid:
            if result.error is not None:
                errors[result.metrics.get("trial_id") or ""] = str(result.error)
        study = self._results_study(progress.records, errors)
        records = progress.records.values()
        finished = sum(r.state in ("COMPLETE", "PRUNED") for r in records)
        if any(r.state == "FAIL" for r in records):
            return EXIT_FAILED, study
        if finished < cfg.trials:
            self._say(
                f"interrupted: {finished} of {cfg.trials} trials finished; the running ones got the preemption stop. "
                "The Ray backend does not resume a study: running the command again starts a new one"
            )
            return EXIT_INTERRUPTED, study
        return EXIT_DONE, study

    def _check_fits(self, cluster: dict[str, float]) -> None:
        per_node = [n.get("Resources", {}).get("CPU", 0) for n in self.ray.nodes() if n.get("Alive")]
        most = max(per_node, default=0)
        if self.cfg.num_proc > most:
            raise ConfigError(
                f"-np {self.cfg.num_proc}: no node of the Ray cluster has {self.cfg.num_proc} CPUs (the largest has "
                f"{most:g}); a trial's ranks share one node: use -np {int(most)} or fewer"
            )

    def _results_study(self, records: dict[str, Any], errors: dict[str, str]) -> Any:
        """An in-memory Optuna study holding what Ray ran, numbered by Ray's trial numbers (the folders)."""
        optuna, cfg = self.optuna, self.cfg
        study = optuna.create_study(
            study_name=cfg.study_name, direction="minimize" if cfg.mode == "min" else "maximize"
        )
        dists = {p.name: _distribution(optuna, p) for p in cfg.space.params}
        State = optuna.trial.TrialState
        for number, rec in enumerate(sorted(records.values(), key=lambda r: (r.key is None, r.key or 0, r.trial_id))):
            state = getattr(State, rec.state if rec.state in ("COMPLETE", "PRUNED", "FAIL") else "FAIL")
            value = rec.epochs[max(rec.epochs)] if rec.epochs else None
            attrs = {KEY_ATTR: rec.key, ATTEMPT_ATTR: rec.attempts}
            if rec.state != "COMPLETE" and rec.state != "PRUNED":
                attrs[ERROR_ATTR] = errors.get(rec.trial_id, "") or f"did not finish (Ray trial {rec.trial_id})"
            start = datetime.datetime.fromtimestamp(rec.started or time.time())
            end = datetime.datetime.fromtimestamp(rec.ended or time.time())
            study.add_trial(
                optuna.trial.FrozenTrial(
                    number=number,
                    state=state,
                    value=value if state == State.COMPLETE else None,
                    datetime_start=start,
                    datetime_complete=end,
                    params=rec.params,
                    distributions=dists,
                    user_attrs=attrs,
                    system_attrs={},
                    intermediate_values=dict(rec.epochs),
                    trial_id=number,
                )
            )
        return study

    def _say(self, line: str) -> None:
        self.stream.write(line + "\n")
        self.stream.flush()


def _quiet_fit(tuner: Any) -> Any:
    """``tuner.fit()`` with Ray Tune's own progress output off (hvdkit prints one line per trial event):
    with RAY_AIR_NEW_OUTPUT=0 its ``verbose=0`` prints nothing, while the default output still prints
    its experiment header. Env: RAY_AIR_NEW_OUTPUT (set for the call, then restored)."""
    before = os.environ.get("RAY_AIR_NEW_OUTPUT")
    os.environ["RAY_AIR_NEW_OUTPUT"] = "0"
    try:
        return tuner.fit()
    finally:
        if before is None:
            os.environ.pop("RAY_AIR_NEW_OUTPUT", None)
        else:
            os.environ["RAY_AIR_NEW_OUTPUT"] = before


def _distribution(optuna: Any, p: Any) -> Any:
    d = optuna.distributions
    if p.kind == "float":
        return d.FloatDistribution(p.low, p.high, log=p.log, step=p.step)
    if p.kind == "int":
        return d.IntDistribution(p.low, p.high, log=p.log, step=p.step or 1)
    return d.CategoricalDistribution(list(p.choices))


def run_ray_study(cfg: TuneConfig, address: str | None = None, stream: TextIO | None = None) -> int:
    """Run ``hvdkit tune --backend ray`` for ``cfg`` on the Ray cluster at ``address`` (None: a local Ray
    this call starts and shuts down), then write the local backend's results; the exit code."""
    stream = stream or sys.stdout
    code, study = RayStudy(cfg, address, stream).run()
    write_results(study, cfg, stream)
    return code
