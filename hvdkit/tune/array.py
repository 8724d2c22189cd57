"""``hvdkit render slurm --tune W``: a SLURM job array of W ``hvdkit tune`` workers on one shared study.

Each array task is one worker on a one-node allocation of ``--parallel x -np`` slots (one CPU each); the workers
meet in the study that ``--storage`` names (a journal file on a shared file system, or a database),
so together they finish the study's ``--trials``. Pure: parses and renders, starts nothing, imports
no Optuna.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from dataclasses import dataclass

from ..core.errors import ConfigError
from ..launcher.render.files import bash_line, bash_word  # the renderer's bash quoting, shared by every target
from ..launcher.render.spec import MEMORY_PATTERN

__all__ = ["TuneArray", "plan_tune_array", "render_tune_array"]

TASK_ID = '"$SLURM_ARRAY_TASK_ID"'
STORAGE_EXAMPLE = "--storage /shared/tune/study.journal (or postgresql+psycopg2://user@dbhost/tune)"


@dataclass(frozen=True)
class TuneArray:
    """W workers of one ``hvdkit tune`` command: its options (``--out`` taken out, ``--study`` fixed),
    its training command (``-- ...``), the results folder each task gets its ``task-N`` in, the slots
    a worker needs, and the job's name and memory."""

    workers: int
    options: tuple
    command: tuple
    out: str
    cpus: int
    name: str
    memory: str


def _without_out(options: list[str]) -> list[str]:
    kept, skip = [], False
    for word in options:
        if skip:
            skip = False
        elif word == "--out":
            skip = True
        elif not word.startswith("--out="):
            kept.append(word)
    return kept


def plan_tune_array(
    command: tuple | list,
    workers: int,
    name: str,
    memory: str,
    parse: Callable[[list[str]], argparse.Namespace],
) -> TuneArray:
    """The array for ``command`` (``hvdkit tune ... -- python train.py ...``) run by ``workers`` tasks;
    ``parse`` reads hvdkit tune's arguments (the words after ``hvdkit tune``; the CLI gives its parser).

    Refuses a command that is not ``hvdkit tune``, one that does not parse, and one without a
    ``--storage`` outside its ``--out`` folder: tasks on different nodes must find one study."""
    words = [str(w) for w in command]
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ConfigError(f"--tune must be the number of workers (array tasks), an integer >= 1 (got {workers!r})")
    if words[:2] != ["hvdkit", "tune"]:
        raise ConfigError(
            f"--tune renders hvdkit tune workers: give the command after '--' as 'hvdkit tune --space ... "
            f"{STORAGE_EXAMPLE} ... -- python train.py' (got {bash_line(words[:3]) or 'nothing'} ...)"
        )
    cut = words.index("--", 2) if "--" in words[2:] else len(words)
    options, training = words[2:cut], tuple(words[cut:])
    try:
        args = parse([*options, *training])
    except SystemExit:  # argparse has printed what is wrong
        raise ConfigError(f"the hvdkit tune command after '--' does not parse: {bash_line(words)}") from None
    if not training[1:]:
        raise ConfigError("the hvdkit tune command has no training command; end it with -- python train.py ...")
    if args.storage is None:
        raise ConfigError(
            "--tune: the hvdkit tune command needs a --storage every node reaches, so that the array's tasks "
            f"work on one study (without it each task keeps its own in its --out folder): add {STORAGE_EXAMPLE}"
        )
    if "://" not in args.storage:
        storage, out = os.path.abspath(args.storage), os.path.abspath(args.out)
        if os.path.commonpath([storage, out]) == out:
            raise ConfigError(
                f"--tune: --storage {args.storage!r} lies in --out {args.out!r}; keep the study outside it, on a "
                f"file system every node shares (each task writes its results to {args.out}/task-N), e.g. "
                f"{STORAGE_EXAMPLE}"
            )
    options = _without_out(options)
    if not any(w == "--study" or w.startswith("--study=") for w in options):
        options += ["--study", name]  # every task must name the same study: fix it in the script
    if not MEMORY_PATTERN.fullmatch(memory):
        raise ConfigError(f"--memory {memory!r} must be a whole number of Mi, Gi or Ti, e.g. 4Gi")
    cpus = args.parallel * args.num_proc
    return TuneArray(workers, tuple(options), training, args.out, cpus, name, memory)


def render_tune_array(array: TuneArray) -> str:
    """The SLURM batch script of ``array``: ``sbatch`` it once for all W workers."""
    memory = MEMORY_PATTERN.fullmatch(array.memory)
    options = bash_line(array.options)
    again = ["hvdkit", "render", "slurm", "--tune", str(array.workers), "--name", array.name]
    again += ["--memory", array.memory, "--", "hvdkit", "tune", *array.options, "--out", array.out, *array.command]
    lines = [
        "#!/bin/bash",
        "# SLURM job array: `sbatch tune.sbatch` in the folder the command's paths start.",
        f"# {array.workers} hvdkit tune worker(s), one per array task, each on one node with {array.cpus} slot(s)",
        "# (--parallel x -np), all on the study that --storage names; together they finish its --trials.",
        "# Rendered by hvdkit from one job description; change the description and render again:",
        f"#   {bash_line(again)}",
        f"#SBATCH --job-name={array.name}",
        f"#SBATCH --array=0-{array.workers - 1}",
        "#SBATCH --nodes=1",
        f"#SBATCH --ntasks={array.cpus}",  # slots: each trial's hvdkit run takes its -np of them
        "#SBATCH --cpus-per-task=1",
        f"#SBATCH --mem={memory.group(1)}{memory.group(2)[0]}",
        "set -euo pipefail",
        "",
        "# hvdkit must be on PATH on every node (activate its virtualenv here if needed). A worker starts a",
        "# trial only while the study has fewer than --trials finished or running trials, so tasks that",
        "# start late find the study done and end at once; rerun the array to resume an unfinished study.",
        "# Each task writes its table, trials.csv, best.json and trial folders under its own task-N folder.",
        f"exec hvdkit tune {options} --out {bash_word(array.out)}/task-{TASK_ID} {bash_line(array.command)}",
    ]
    return "\n".join(lines) + "\n"
