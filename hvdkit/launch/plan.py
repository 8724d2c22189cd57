"""Turn a JobSpec into the exact argv and environment to start it. Pure: starts nothing."""

import os
import shutil
import sys
from dataclasses import dataclass

from ..core import env as _env
from .spec import JobSpec

__all__ = ["Plan", "build", "find_tool"]


@dataclass(frozen=True)
class Plan:
    """An argv list and the variables to add to the launcher's environment."""

    argv: tuple
    env: dict

    def full_env(self, base=None):
        merged = dict(os.environ if base is None else base)
        merged.update(self.env)
        return merged


def find_tool(name, python):
    """``name`` next to ``python`` (the virtualenv's copy) if there, else from PATH, else bare."""
    beside = os.path.join(os.path.dirname(python), name)
    return beside if os.access(beside, os.X_OK) else (shutil.which(name) or name)


def build(spec: JobSpec, *, is_root, cores, python=None, status_dir=None, progress=None, base_env=None):
    """The Plan that runs ``spec``.

    Each rank runs ``python -m hvdkit.launch.rankwrap -- COMMAND``: the wrapper records how the
    rank ended in ``status_dir`` so the launcher can name the rank that failed first.
    ``is_root`` adds mpirun's ``--allow-run-as-root``; ``num_proc > cores`` adds ``--oversubscribe``.
    ``progress`` (True/False/None) sets HVDKIT_PROGRESS for the ranks unless the user set it.
    """
    python = python or sys.executable
    base_env = os.environ if base_env is None else base_env
    env = dict(spec.env)
    env.setdefault("PYTHONUNBUFFERED", "1")  # ranks' output is streamed through a pipe
    if status_dir:
        env[_env.STATUS_DIR] = status_dir
    if progress is not None and _env.PROGRESS not in base_env and _env.PROGRESS not in env:
        env[_env.PROGRESS] = "1" if progress else "0"
    wrapped = (python, "-m", "hvdkit.launch.rankwrap", "--", *spec.command) if status_dir else spec.command
    n = str(spec.num_proc)
    if spec.controller == "gloo":
        argv = (find_tool("horovodrun", python), "-np", n, "-H", f"localhost:{n}", "--gloo", *wrapped)
    else:
        argv = [find_tool("mpirun", python), "-np", n]
        if is_root:
            argv.append("--allow-run-as-root")
        if spec.num_proc > cores:
            argv.append("--oversubscribe")
        argv += ["--bind-to", "none", "--map-by", "slot", "--tag-output"]
        for name in sorted(env):
            argv += ["-x", name]
        argv += [*spec.mpi_args, *wrapped]
        argv = tuple(argv)
    return Plan(argv=argv, env=env)
