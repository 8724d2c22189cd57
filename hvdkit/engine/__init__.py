"""The Horovod engine, for any Python environment: hvdkit ships its build recipe as package data.

``recipe/build-horovod.sh`` builds Horovod 0.28.1 from its PyPI sdist with the three source edits and
hvdkit's engine fixes (``recipe/horovod-fixes/*.patch``) against the torch and TensorFlow installed in
the target environment, caches the wheel under a key of every input and installs it. ``make setup``
runs the same script (through ``scripts/build-horovod.sh``), so either one's wheel is the other's
cache hit. This package imports only the standard library.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterable
from pathlib import Path
from typing import TextIO

from ..core.errors import HvdkitError

__all__ = [
    "RECIPE",
    "BUILD_SCRIPT",
    "APPLY_SCRIPT",
    "FIXES",
    "EngineError",
    "fix_level",
    "wheel_dir",
    "plan",
    "install",
]

RECIPE = Path(__file__).resolve().with_name("recipe")
BUILD_SCRIPT = RECIPE / "build-horovod.sh"
APPLY_SCRIPT = RECIPE / "apply-horovod-fixes.sh"
FIXES = RECIPE / "horovod-fixes"


class EngineError(HvdkitError, RuntimeError):
    """The engine could not be built, installed or checked; the message names the cause and the fix."""


def _script(argv, python, env=None):
    """Run a recipe script for ``python``; its stdout. Raises EngineError with its last error line."""
    full_env = {**os.environ, "PYTHON": str(python or sys.executable), **(env or {})}
    done = subprocess.run(
        ["bash", *map(str, argv)], capture_output=True, text=True, env=full_env, stdin=subprocess.DEVNULL
    )
    if done.returncode != 0:
        raise EngineError(_last_error(done.stderr) or f"{argv[0]} failed (exit {done.returncode})")
    return done.stdout.strip()


def _last_error(text):
    errors = [line.split("ERROR: ", 1)[1] for line in text.splitlines() if "] ERROR: " in line]
    return errors[-1] if errors else None


def fix_level() -> str:
    """The fix level of the engine fixes shipped with this hvdkit, e.g. ``hvdkit-fixes-0123456789ab``.

    An engine built by this hvdkit's recipe reports the same level in ``horovodrun --check-build``.
    """
    return _script([APPLY_SCRIPT, "--level"], None)


def _variant_env(gpu, cuda_archs):
    env = {}
    if gpu is not None:
        env["HVDKIT_ENGINE_GPU"] = {True: "on", False: "off"}.get(gpu, gpu)
    if cuda_archs:
        env["HVDKIT_CUDA_ARCHS"] = ",".join(map(str, cuda_archs)) if not isinstance(cuda_archs, str) else cuda_archs
    return env


def wheel_dir(
    python: str | os.PathLike[str] | None = None,
    gpu: bool | str | None = None,
    cuda_archs: str | Iterable[int | str] | None = None,
) -> Path:
    """The wheel cache folder for ``python``'s environment (its name ends in the cache key); builds nothing.

    ``gpu`` and ``cuda_archs`` as for ``install``.
    Env: ``HVDKIT_WHEEL_CACHE`` (default ``~/.cache/hvdkit/wheels``), ``HOROVOD_VERSION``.
    """
    return Path(_script([BUILD_SCRIPT, "--key"], python, _variant_env(gpu, cuda_archs)))


def plan(
    python: str | os.PathLike[str] | None = None,
    gpu: bool | str | None = None,
    cuda_archs: str | Iterable[int | str] | None = None,
) -> str:
    """The build plan for ``python``'s environment, in words: variant (``cpu`` or ``gpu``), the exact
    ``HOROVOD_*`` build settings, the engine fixes and the wheel cache folder; builds nothing.

    ``gpu`` and ``cuda_archs`` as for ``install``. Raises :class:`EngineError` where no engine can be
    built as asked (``gpu=True`` with a CPU build of torch, no CUDA compiler, an unknown architecture).
    """
    return _script([BUILD_SCRIPT, "--dry-run"], python, _variant_env(gpu, cuda_archs))


def install(
    python: str | os.PathLike[str] | None = None,
    jobs: int | None = None,
    out: TextIO | None = None,
    gpu: bool | str | None = None,
    cuda_archs: str | Iterable[int | str] | None = None,
) -> str:
    """Build (or take from the cache) and install the engine into ``python``'s environment; a summary line.

    ``gpu``: None (default: NCCL when the installed torch is a CUDA build), True (NCCL, or an error
    naming why not) or False (a CPU engine even with a CUDA torch). ``cuda_archs``: the CUDA
    architectures of a GPU build (``"90"``, ``[80, 90]``; default the visible GPUs', else a
    documented list: docs/gpu.md). Progress lines go to ``out`` (default stderr) as they come.
    Raises :class:`EngineError` naming what is missing (a framework, a compiler, CUDA) and how to
    install it.

    Env: ``HVDKIT_WHEEL_CACHE``, ``HVDKIT_BUILD_JOBS`` (``jobs`` wins), ``HOROVOD_VERSION``,
    ``HVDKIT_ENGINE_GPU`` and ``HVDKIT_CUDA_ARCHS`` (the arguments win), ``HOROVOD_CUDA_HOME``.
    """
    out = out or sys.stderr
    python = str(python or sys.executable)
    env = {
        **os.environ,
        "PYTHON": python,
        **({"HVDKIT_BUILD_JOBS": str(jobs)} if jobs else {}),
        **_variant_env(gpu, cuda_archs),
    }
    started = time.monotonic()
    proc = subprocess.Popen(
        ["bash", str(BUILD_SCRIPT)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
        stdin=subprocess.DEVNULL,
    )
    lines = []
    with proc.stdout:
        for line in proc.stdout:
            lines.append(line)
            if "] ERROR: " not in line:  # the error itself is the command's one-line report
                out.write(line)
                out.flush()
    rc = proc.wait()
    text = "".join(lines)
    if rc != 0:
        raise EngineError(_last_error(text) or f"the engine recipe failed (exit {rc}); its output is above")
    return _summary(text, python, time.monotonic() - started)


def _summary(text, python, seconds):
    if "already installed" in text:
        how = "already installed and checked, nothing to do"
    elif "using cached wheel" in text:
        how = "installed from the cached wheel (cache hit)"
    else:
        how = "built, cached and installed"
    return f"Horovod engine for {python}: {how} in {seconds:.1f} s"
