"""``hvdkit doctor``: what is installed, what Horovod was built with, and a 2-rank smoke test."""

import platform
import re
import subprocess
import sys
from importlib.metadata import PackageNotFoundError, version

from .plan import find_tool

__all__ = ["diagnose", "check_build"]

_FIX_SETUP = "run `make setup` in the hvdkit checkout (it installs and builds everything)"


def _version(*names):
    for name in names:
        try:
            return version(name)
        except PackageNotFoundError:
            continue
    return None


def _run(argv, timeout):
    try:
        p = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    except FileNotFoundError:
        return 127, f"{argv[0]}: not found"
    except subprocess.TimeoutExpired:
        return 124, f"timed out after {timeout} s"
    return p.returncode, p.stdout + p.stderr


def check_build(report):
    """``{part: built?}`` from the text of ``horovodrun --check-build``."""
    return {m.group(2): m.group(1) == "X" for m in re.finditer(r"\[([ X])\] (\w[\w ]*)", report)}


def diagnose(python=None, smoke=True, out=None):
    """Print the environment report; return the list of problems (empty when all is well)."""
    out = out or sys.stdout
    python = python or sys.executable
    problems = []

    def row(name, value, fix=None):
        out.write(f"  {name:<26} {value if value else 'MISSING'}\n")
        if not value and fix:
            problems.append(f"{name} is missing: {fix}")

    out.write("hvdkit doctor\n")
    row("python", f"{platform.python_version()} ({python})")
    row("torch", _version("torch"), _FIX_SETUP)
    row("tensorflow", _version("tensorflow-cpu", "tensorflow"))
    row("keras", _version("keras"))
    horovod = _version("horovod")
    row("horovod", horovod, _FIX_SETUP)
    row("mpi4py", _version("mpi4py"))
    rc, text = _run([find_tool("mpirun", python), "--version"], 30)
    row("open mpi", text.splitlines()[0] if rc == 0 else None, "apt-get install openmpi-bin libopenmpi-dev")
    built = {}
    if horovod:
        rc, report = _run([find_tool("horovodrun", python), "--check-build"], 120)
        built = check_build(report) if rc == 0 else {}
    for part in ("PyTorch", "TensorFlow", "MPI", "Gloo"):
        row(f"horovod built with {part}", "yes" if built.get(part) else None, f"rebuild Horovod: {_FIX_SETUP}")
    if smoke and not problems:
        for controller in ("mpi", "gloo"):
            ok, detail = _smoke(python, controller)
            row(f"2-rank allreduce ({controller})", detail if ok else None, f"{detail}; try `hvdkit run -np 2 ...` by hand")
    out.write("all checks passed\n" if not problems else "problems:\n" + "".join(f"  - {p}\n" for p in problems))
    return problems


def _smoke(python, controller):
    argv = [python, "-m", "hvdkit", "run", "-np", "2", *(["--gloo"] if controller == "gloo" else []), "--"]
    rc, text = _run(argv + [python, "-m", "hvdkit.torch.smoke"], 180)
    found = re.findall(r"allreduce ok: (.*)", text)
    if rc == 0 and len(found) == 2:
        return True, f"ok ({found[0].strip()})"
    return False, f"failed (exit {rc}): {text.strip().splitlines()[-1] if text.strip() else 'no output'}"
