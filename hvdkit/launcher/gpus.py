"""How many NVIDIA GPUs this machine's ranks can use, found without CUDA, torch or a GPU library.

``hvdkit run`` starts one rank per GPU when ``-np`` is left out and GPUs are visible; ``hvdkit
doctor`` lists them. Every probe is injectable, so the logic is tested on machines without GPUs.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Callable, Mapping, Sequence

__all__ = ["CUDA_VISIBLE_DEVICES", "PROC_GPUS", "gpu_count", "nvidia_smi", "physical_gpus", "visible_devices"]

CUDA_VISIBLE_DEVICES = "CUDA_VISIBLE_DEVICES"
PROC_GPUS = "/proc/driver/nvidia/gpus"  # one entry (a PCI bus id) per GPU the driver runs
_NONE = ("", "-1", "none", "nodevfiles")  # "none"/"NoDevFiles": what NVIDIA's container runtime writes for no GPU
_UUID = re.compile(r"(GPU|MIG)-[0-9A-Za-z-]+")
_SMI_TIMEOUT = 20


def visible_devices(value: str | None) -> tuple[str, ...] | None:
    """The devices ``CUDA_VISIBLE_DEVICES=value`` lets CUDA see, as a tuple of strings; ``None`` when unset.

    Like the CUDA runtime: entries are indices (``0,2``) or UUIDs (``GPU-8e2c...``, ``MIG-...``),
    spaces around them are ignored, and the list ends at the first entry that is neither (``-1``, an
    empty entry, a word), so ``0,-1,1`` is ``("0",)``. ``""``, ``-1`` and ``none`` mean no GPU: ``()``.
    """
    if value is None:
        return None
    if value.strip().lower() in _NONE:
        return ()
    kept = []
    for entry in value.split(","):
        entry = entry.strip()
        if not (entry.isdigit() or _UUID.fullmatch(entry)):
            break
        kept.append(str(int(entry)) if entry.isdigit() else entry)
    return tuple(kept)


def nvidia_smi(
    args: Sequence[str],
    *,
    which: Callable[[str], str | None] = shutil.which,
    run: Callable[..., subprocess.CompletedProcess[str]] = subprocess.run,
) -> str | None:
    """The output of ``nvidia-smi ARGS`` when it is on PATH and succeeds, else ``None``."""
    tool = which("nvidia-smi")
    if tool is None:
        return None
    try:
        done = run([tool, *args], capture_output=True, text=True, timeout=_SMI_TIMEOUT, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout if done.returncode == 0 else None  # e.g. "NVIDIA-SMI has failed": no usable driver


def physical_gpus(
    *,
    smi: Callable[[list[str]], str | None] | None = None,
    listdir: Callable[[str], list[str]] = os.listdir,
    proc_dir: str = PROC_GPUS,
) -> int:
    """How many NVIDIA GPUs this machine has: the ``GPU n:`` lines of ``nvidia-smi -L``, else the
    entries of ``/proc/driver/nvidia/gpus``, else 0.

    ``smi(args)`` returns nvidia-smi's output or ``None`` (default: ``nvidia_smi``).
    """
    listing = (smi or nvidia_smi)(["-L"])
    if listing is not None:
        return sum(1 for line in listing.splitlines() if line.startswith("GPU "))
    try:
        return len(listdir(proc_dir))
    except OSError:  # no NVIDIA driver loaded
        return 0


def gpu_count(env: Mapping[str, str] | None = None, *, physical: int | Callable[[], int] | None = None) -> int:
    """How many GPUs the ranks started here can use; 0 on a machine without NVIDIA GPUs.

    The GPUs of this machine (``physical``: a count, or a function returning it; default
    ``physical_gpus``), limited by ``CUDA_VISIBLE_DEVICES`` when it is set: index entries count when
    they name one of those GPUs (the list ends at the first that does not, as in CUDA), UUIDs count
    as they are; ``""``, ``-1`` and ``none`` leave none.

    Env: CUDA_VISIBLE_DEVICES (from ``env``, default ``os.environ``).
    """
    env = os.environ if env is None else env
    visible = visible_devices(env.get(CUDA_VISIBLE_DEVICES))
    if visible == ():
        return 0
    found = physical if isinstance(physical, int) else (physical or physical_gpus)()
    if visible is None or found == 0:
        return found
    usable = 0
    for entry in visible:
        if entry.isdigit() and int(entry) >= found:
            break
        usable += 1
    return min(usable, found)
