"""What ``hvdkit tune`` was asked for, shared by its backends: ``TuneConfig``, the exit codes, and the
placeholders of the training command.

``hvdkit/cli/tune.py`` turns the parsed flags into one frozen ``TuneConfig``; the local driver
(``study.py``) and the Ray backend (``ray_backend.py``, ``ray_trial.py``) read only that. Pure: imports
no Optuna and no Ray.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..core.errors import ConfigError
from .space import SearchSpace

__all__ = [
    "TuneConfig",
    "EXIT_DONE",
    "EXIT_FAILED",
    "EXIT_INTERRUPTED",
    "PLACEHOLDERS",
    "substitute",
    "placeholder_note",
]

PLACEHOLDERS = ("{trial_dir}", "{trial}")  # replaced in the command's words: the trial's folder and key
# hvdkit tune's exit codes: every trial done; a parameter set kept failing or --max-failures trials
# failed; interrupted by a signal (running the same command again resumes)
EXIT_DONE, EXIT_FAILED, EXIT_INTERRUPTED = 0, 1, 130


@dataclass(frozen=True)
class TuneConfig:
    """What ``hvdkit tune`` was asked for (validated by ``check``)."""

    space: SearchSpace
    metric: str
    mode: str
    trials: int
    command: tuple
    parallel: int = 1
    num_proc: int = 1
    pruner: str = "median"
    pruner_startup_trials: int = 5
    pruner_warmup_epochs: int = 0
    storage: str | None = None
    study_name: str = "hvdkit-tune"
    out: str = "tune-out"
    retries: int = 1
    max_failures: int = 10  # failed attempts (any parameters) in this run before the search ends
    seed: int | None = None
    run_flags: tuple = ()
    poll_interval: float = 0.2
    status_interval: float = 30.0
    kill_after: float = 90.0  # seconds after a graceful stop before the trial's process group is killed
    backend: str = "local"  # where trials run: "local" (study.py) or "ray" (ray_backend.py)
    ray_address: str | None = None  # backend "ray": the cluster to join; None: a local Ray

    def check(self) -> None:
        """Raise ConfigError naming the first value that cannot work, and how to fix it."""
        self._check_backend()
        if self.mode not in ("min", "max"):
            raise ConfigError(f"--mode must be min or max (got {self.mode!r}): minimize or maximize --metric")
        if not self.metric or not isinstance(self.metric, str):
            raise ConfigError("--metric must name a reported metric, e.g. --metric val_loss")
        for flag, value, least in (
            ("--trials", self.trials, 1),
            ("--retries", self.retries, 0),
            ("--max-failures", self.max_failures, 1),
            ("--pruner-startup-trials", self.pruner_startup_trials, 0),
            ("--pruner-warmup-epochs", self.pruner_warmup_epochs, 0),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise ConfigError(f"{flag} must be an integer >= {least} (got {value!r})")
        if not self.command:
            raise ConfigError("no training command given; put it after '--', e.g. -- python train.py --epochs 5")
        taken = set(self.space.names())
        for word in self.command:
            if word.startswith("--") and word[2:].split("=")[0] in taken:
                raise ConfigError(
                    f"the command already has {word!r}, which the search space sets ({word[2:].split('=')[0]}); "
                    "remove it from the command (each trial gets --NAME VALUE for every space key)"
                )

    def _check_backend(self) -> None:
        if self.backend != "ray":
            if self.ray_address is not None:
                raise ConfigError(f"--ray-address {self.ray_address!r} needs --backend ray")
            return
        if self.storage is not None:
            raise ConfigError(
                f"--storage {self.storage!r} is for the local backend (several hvdkit tune processes on one study); "
                "with --backend ray, Ray runs every trial of the study: leave --storage out"
            )


def substitute(command: tuple, trial_dir: str, key: int) -> list[str]:
    """``command`` with ``{trial_dir}`` and ``{trial}`` replaced in each word (nothing else is touched)."""
    return [w.replace("{trial_dir}", trial_dir).replace("{trial}", str(key)) for w in command]


def placeholder_note(command: tuple) -> str | None:
    """A warning when no word of ``command`` names ``{trial_dir}``: every trial would then share the
    script's checkpoint folder, and resume from another trial's checkpoint. None when one does."""
    if any("{trial_dir}" in w for w in command):
        return None
    return (
        "note: the command has no {trial_dir}: if the script checkpoints, give each trial its own folder "
        "(e.g. --checkpoint-dir {trial_dir}/ckpt), or a trial resumes from another trial's checkpoint"
    )
