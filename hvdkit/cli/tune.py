"""``hvdkit tune``: hyperparameter search whose trials are ``hvdkit run`` jobs (Optuna underneath)."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from ..core.errors import ConfigError

if TYPE_CHECKING:
    from ..tune.config import TuneConfig

__all__ = ["register", "main", "config_from_args"]

EXAMPLE = (
    "hvdkit tune --space space.yaml --metric val_loss --mode min --trials 20 --parallel 2 -np 1 "
    "-- python train.py --epochs 10 --checkpoint-dir {trial_dir}/ckpt"
)


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``hvdkit tune`` to the sub-command parsers ``sub``."""
    from ..tune.storage import PRUNERS

    t = sub.add_parser(
        "tune",
        help="hyperparameter search: each trial is an 'hvdkit run -np K' job, up to P at once",
        description="Search hyperparameters; each trial runs 'hvdkit run -np K -- COMMAND --name value ...' "
        "pinned to its own cores. The script reports with hvdkit.tune.report(epoch, metric=value) "
        "(hvdkit's Trainer, Tracker and Keras TrackMetricsCallback do it by themselves). "
        "'{trial_dir}' and '{trial}' in COMMAND become the trial's folder and number. Running the same "
        f"command again resumes the study. Example: {EXAMPLE}",
    )
    t.add_argument("--space", required=True, metavar="SPACE.yaml", help="the search space (YAML; see docs)")
    t.add_argument("--metric", required=True, metavar="NAME", help="the reported metric to optimize, e.g. val_loss")
    t.add_argument("--mode", required=True, choices=("min", "max"), help="minimize or maximize --metric")
    t.add_argument("--trials", required=True, type=int, metavar="N", help="trials to finish (COMPLETE + PRUNED)")
    t.add_argument("--parallel", type=int, default=1, metavar="P", help="trials at once (default 1)")
    t.add_argument(
        "-np", "--num-proc", dest="num_proc", type=int, default=1, metavar="K", help="ranks per trial (default 1)"
    )
    t.add_argument("--pruner", choices=PRUNERS, default="median", help="stop bad trials early (default median)")
    t.add_argument(
        "--pruner-startup-trials",
        type=int,
        default=5,
        metavar="N",
        help="median pruner: finished trials before it prunes (default 5)",
    )
    t.add_argument(
        "--pruner-warmup-epochs",
        type=int,
        default=0,
        metavar="E",
        help="median pruner: never prune before epoch E (0-based; default 0)",
    )
    t.add_argument(
        "--storage",
        metavar="URL|FILE",
        help="where the study lives: an RDB URL (sqlite:///s.db, postgresql://...) or a journal file on shared "
        "storage, for several hvdkit tune processes on one study (default: OUT/study.journal)",
    )
    t.add_argument(
        "--study", dest="study_name", default="hvdkit-tune", metavar="NAME", help="study name (default hvdkit-tune)"
    )
    t.add_argument(
        "--out", default="tune-out", metavar="DIR", help="results, trial folders and logs (default tune-out)"
    )
    t.add_argument(
        "--retries",
        type=int,
        default=1,
        metavar="R",
        help="rerun a failed trial's parameters up to R times (default 1)",
    )
    t.add_argument(
        "--max-failures",
        type=int,
        default=10,
        metavar="F",
        help="end the search (exit 1) after F failed trials in this run, retries included (default 10)",
    )
    t.add_argument("--seed", type=int, default=None, help="the sampler's seed (TPE), for a repeatable search")
    t.add_argument("--gloo", action="store_true", help="trials run under horovodrun --gloo instead of mpirun")
    t.add_argument(
        "--status-interval", type=float, default=30.0, metavar="SECONDS", help="status line period (default 30)"
    )
    t.add_argument(
        "--backend",
        choices=("local", "ray"),
        default="local",
        help="where trials run: local (this machine's cores, default) or ray (Ray Tune; pip install 'hvdkit[ray]')",
    )
    t.add_argument(
        "--ray-address",
        metavar="ADDR",
        default=None,
        help="--backend ray: the Ray cluster to join (e.g. 10.0.0.1:6379); default: a local Ray on this machine",
    )
    t.add_argument("command", nargs=argparse.REMAINDER, help="the training command, after '--'")


def main(args: argparse.Namespace) -> int:
    """Run ``hvdkit tune`` from parsed arguments; the exit code (0 done, 1 a parameter set kept failing or
    --max-failures trials failed, 130 interrupted)."""
    cfg = config_from_args(args)
    if cfg.backend == "ray":
        from ..tune.ray_backend import run_ray_study

        return run_ray_study(cfg, address=cfg.ray_address)
    from ..tune.study import run_study

    return run_study(cfg)


def config_from_args(args: argparse.Namespace) -> TuneConfig:
    """The frozen ``TuneConfig`` of ``hvdkit tune``'s parsed arguments: the parsed flags go no further.
    Raises ConfigError for a missing training command or a bad --status-interval; the backends check
    the rest (``TuneConfig.check``) before they start anything."""
    from ..launcher.spec import check_command
    from ..tune.config import TuneConfig
    from ..tune.space import load_space

    command = tuple(args.command[1:] if args.command[:1] == ["--"] else args.command)
    if not command:
        raise ConfigError(f"no training command given; put it after '--', e.g. {EXAMPLE}")
    check_command(command)
    if args.status_interval <= 0:
        raise ConfigError(f"--status-interval must be > 0 seconds (got {args.status_interval!r})")
    return TuneConfig(
        space=load_space(args.space),
        metric=args.metric,
        mode=args.mode,
        trials=args.trials,
        command=command,
        parallel=args.parallel,
        num_proc=args.num_proc,
        pruner=args.pruner,
        pruner_startup_trials=args.pruner_startup_trials,
        pruner_warmup_epochs=args.pruner_warmup_epochs,
        storage=args.storage,
        study_name=args.study_name,
        out=args.out,
        retries=args.retries,
        max_failures=args.max_failures,
        seed=args.seed,
        run_flags=("--gloo",) if args.gloo else (),
        status_interval=args.status_interval,
        backend=args.backend,
        ray_address=args.ray_address,
    )
