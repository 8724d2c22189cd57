"""``hvdkit doctor``: what is installed, what Horovod was built with, and a 2-rank smoke test.

The engine must carry the fix level of the recipe shipped with this hvdkit (``hvdkit.engine``): an
engine from an older hvdkit, or an unpatched upstream one, is a problem whose fix is
``hvdkit engine install``.

On a machine with NVIDIA GPUs also: the GPUs and driver, torch's CUDA and NCCL versions, whether
the engine has NCCL, and a 2-rank NCCL allreduce (``hvdkit.diagnostics.doctor_gpu``).

With ``--hosts``: every host reachable over ssh, the same versions everywhere, the route and
network interface to each, and an allreduce across all of them.
"""

from __future__ import annotations

import json
import platform
import re
import shlex
import socket
import sys
from collections.abc import Callable, Sequence
from importlib.metadata import PackageNotFoundError, version
from typing import TYPE_CHECKING, TextIO

from ..launcher.child import run_child
from ..launcher.hosts import format_hosts
from ..launcher.plan import find_tool
from ..launcher.remote import is_this_machine, remote_json
from . import doctor_gpu

if TYPE_CHECKING:
    from ..launcher.hosts import Host

__all__ = ["diagnose", "check_build", "engine_fix_level", "local_versions"]

_FIX_SETUP = (
    "install torch and tensorflow-cpu (pip install 'hvdkit[torch,tensorflow]'), then run `hvdkit engine install` "
    "(in an hvdkit checkout `make setup` does both)"
)
# check-build imports TensorFlow and torch several times: about 25 s on a quiet machine, minutes on a busy one.
_CHECK_BUILD_TIMEOUT = 300
_CPU_SMOKE = ("-m", "hvdkit.torch.smoke")  # rank r contributes r+1 to a CPU tensor
_FIX_ENGINE = (
    "run `hvdkit engine install` (it builds Horovod for this environment; in an hvdkit checkout `make setup` does it)"
)


def _version(*names):
    for name in names:
        try:
            return version(name)
        except PackageNotFoundError:
            continue
    return None


def _run(argv, timeout):
    """``(exit code, output)`` of ``argv``; 127, 126 or 124 (with what happened) when it is not
    there, cannot run, or ran past ``timeout`` seconds (then it and all it started are stopped)."""
    try:
        done = run_child(argv, timeout=timeout, grace=5)
    except FileNotFoundError:
        return 127, f"{argv[0]}: not found"
    except OSError as e:  # found but not runnable: a folder, no permission, not a program
        return 126, f"cannot run {argv[0]} ({e.strerror})"
    if done.timed_out:
        return 124, f"timed out after {timeout} s"
    return done.exit_code, done.output


def _tool_fix(name, python, rc, text, fix):
    """The fix for tool ``name`` that answered ``rc``/``text``: says whether it was missing or broken."""
    if rc == 127:
        return f"{name} is not next to {python} nor on PATH: {fix}"
    if rc == 126:
        return f"{text}: {fix}"
    return fix


def local_versions(python: str | None = None) -> dict[str, str | None]:
    """The versions that must match on every host of a job."""
    python = python or sys.executable
    rc, text = _run([find_tool("mpirun", python), "--version"], 30)
    return {
        "python": platform.python_version(),
        "torch": _version("torch"),
        "tensorflow": _version("tensorflow-cpu", "tensorflow"),
        "keras": _version("keras"),
        "horovod": _version("horovod"),
        "open mpi": text.splitlines()[0] if rc == 0 and text else None,
    }


def _route(name):
    """``dev`` and source address this machine uses to reach host ``name`` (from ``ip route get``)."""
    try:
        address = socket.gethostbyname(name)
    except OSError:
        return None, None
    rc, text = _run(["ip", "-o", "route", "get", address], 10)
    m = re.search(r"dev (\S+).*?src (\S+)", text) if rc == 0 else None
    return (m.group(1), m.group(2)) if m else (None, None)


def check_build(report: str) -> dict[str, bool]:
    """``{part: built?}`` from the text of ``horovodrun --check-build``."""
    return {m.group(2): m.group(1) == "X" for m in re.finditer(r"\[([ X])\] (\w[\w ]*)", report)}


def engine_fix_level(report: str) -> str | None:
    """The hvdkit engine fix level named in ``horovodrun --check-build`` output, or ``None``.

    ``None`` means an unpatched upstream engine: its check-build prints no fix level (the line comes
    from fix 01 in ``hvdkit/engine/recipe/horovod-fixes``).
    """
    m = re.search(r"^\s*hvdkit engine fixes: (hvdkit-fixes-\S+.*)$", report, re.MULTILINE)
    return m.group(1).strip() if m else None


def diagnose(
    python: str | None = None,
    smoke: bool = True,
    out: TextIO | None = None,
    hosts: Sequence[Host] = (),
    network_interface: str | None = None,
    gpu_facts: Callable[[], doctor_gpu.GpuFacts] | None = None,
) -> list[str]:
    """Print the environment report; return the list of problems (empty when all is well).

    ``gpu_facts()`` returns this machine's ``doctor_gpu.GpuFacts`` (default: nvidia-smi, then torch and
    Horovod asked in a child python); a machine without GPUs is no problem.

    Env: CUDA_VISIBLE_DEVICES (the GPUs the ranks see).
    """
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
    row("horovod", horovod, _FIX_ENGINE)
    row("mpi4py", _version("mpi4py"))
    rc, text = _run([find_tool("mpirun", python), "--version"], 30)
    mpi_fix = _tool_fix("mpirun", python, rc, text, "apt-get install openmpi-bin libopenmpi-dev")
    row("open mpi", text.splitlines()[0] if rc == 0 and text else None, mpi_fix)
    built, report, runnable = {}, "", True
    if horovod:
        rc, report = _run([find_tool("horovodrun", python), "--check-build"], _CHECK_BUILD_TIMEOUT)
        built = check_build(report) if rc == 0 else {}
        runnable = rc == 0
        if rc in (126, 127):  # the engine may be fine; what is missing is its launcher
            row("horovodrun", None, _tool_fix("horovodrun", python, rc, report, _FIX_ENGINE))
        elif rc != 0:  # what the engine was built with is unknown, not missing
            last = report.strip().splitlines()[-1] if report.strip() else f"exit {rc}"
            row("horovodrun --check-build", None, f"it failed ({last}); run it by hand to see why, or {_FIX_ENGINE}")
    tensorflow = bool(_version("tensorflow-cpu", "tensorflow"))
    for part in ("PyTorch", "TensorFlow", "MPI", "Gloo") if runnable else ():
        if part == "TensorFlow" and not tensorflow and not built.get(part):  # a PyTorch-only engine (the GPU image's)
            row(f"horovod built with {part}", "no (TensorFlow is not installed here: a PyTorch-only engine)")
            continue
        row(f"horovod built with {part}", "yes" if built.get(part) else None, f"rebuild Horovod: {_FIX_ENGINE}")
    if horovod and runnable:
        _engine_fixes_row(engine_fix_level(report), row)
    facts = (gpu_facts or (lambda: doctor_gpu.gpu_facts(python, _run, torch_installed=bool(_version("torch")))))()
    nccl_check = doctor_gpu.gpu_rows(facts, row, engine_nccl=built.get("NCCL") if horovod and runnable else None)
    if smoke and not problems:
        for controller in ("mpi", "gloo"):
            ok, detail = _smoke(python, controller)
            row(
                f"2-rank allreduce ({controller})",
                detail if ok else None,
                f"{detail}; try `hvdkit run -np 2 ...` by hand",
            )
    if smoke and not problems and nccl_check:
        _nccl_smoke(python, facts, row)
    if hosts and not problems:
        _diagnose_hosts(hosts, python, network_interface, row, smoke)
    out.write("all checks passed\n" if not problems else "problems:\n" + "".join(f"  - {p}\n" for p in problems))
    return problems


def _engine_fixes_row(installed, row):
    """The engine's fix level, a problem unless it is the level of the recipe shipped with this hvdkit."""
    from ..engine import EngineError, fix_level

    try:
        shipped = fix_level()
    except EngineError as e:  # the recipe is package data; without bash it cannot be read
        shipped = None
        row("hvdkit engine recipe", None, f"cannot read its fix level ({e}); reinstall hvdkit")
    if installed is None:
        row(
            "horovod engine fixes",
            None,
            f"an unpatched upstream engine (Horovod's own TF/Keras API fails on Keras 3): {_FIX_ENGINE}",
        )
    elif shipped and not installed.startswith(f"{shipped} "):
        row("horovod engine fixes", None, f"the engine carries {installed}, this hvdkit ships {shipped}: {_FIX_ENGINE}")
    else:
        row("horovod engine fixes", installed)


def _diagnose_hosts(hosts, python, network_interface, row, smoke):
    here = local_versions(python)
    for host in hosts:
        if is_this_machine(host.name):
            row(f"host {host.name}", "this machine")
            continue
        # ssh hands the remote shell one string: quote it, or a path with a space splits there.
        command = shlex.join([python, "-m", "hvdkit.diagnostics.doctor", "--versions-json"])
        there, error = remote_json(host.name, [command])
        if there is not None and not isinstance(there, dict):
            there, error = None, f"unexpected answer {there!r}"
        if there is None:
            row(f"host {host.name}", None, f"{error}; check `ssh {host.name} {shlex.quote(command)}`")
            continue
        differ = [f"{k} {here[k]} here, {there.get(k)} there" for k in here if there.get(k) != here[k]]
        fix = "install the same versions everywhere (one image, or `make setup` at the same path on every host)"
        row(f"host {host.name}", None if differ else "reachable, same versions", f"{'; '.join(differ)}: {fix}")
        dev, src = _route(host.name)
        if network_interface and dev and dev != network_interface:
            row(f"route to {host.name}", None, f"it leaves through {dev}, not --network-interface {network_interface}")
        else:
            row(f"route to {host.name}", f"via {dev} (from {src})" if dev else "unknown (no `ip route get`)")
    if smoke:
        n = sum(h.slots for h in hosts)
        ok, detail = _smoke(python, "mpi", hosts, network_interface, n)
        row(f"{n}-rank allreduce across hosts", detail if ok else None, f"{detail}; try `hvdkit run` by hand")


def _nccl_smoke(python, facts, row):
    """The 2-rank allreduce of CUDA tensors (NCCL), with NCCL_MULTI_RANK_GPU_ENABLE=1 when 2 ranks share GPUs."""
    extra, skipped = doctor_gpu.nccl_smoke_plan(facts)
    if skipped:
        row("2-rank allreduce (nccl)", skipped)
        return
    ok, detail = _smoke(python, "mpi", extra=extra, program=["-c", doctor_gpu.NCCL_SMOKE])
    row("2-rank allreduce (nccl)", detail if ok else None, f"{detail}; run it with NCCL_DEBUG=INFO to see why")


def _smoke(python, controller, hosts=(), network_interface=None, ranks=2, extra=(), program=_CPU_SMOKE):
    """``(ok, detail)`` of ``hvdkit run -np RANKS [EXTRA] -- python PROGRAM``: each rank must print "allreduce ok".

    The CPU check runs its ranks with HVDKIT_DEVICE=cpu: it checks the CPU path, and on a host with
    fewer GPUs than ranks ``hk.init()`` would rightly refuse to pin them (found on a one-GPU H100).
    """
    if tuple(program) == _CPU_SMOKE:
        extra = [*extra, "-x", "HVDKIT_DEVICE=cpu"]
    argv = [python, "-m", "hvdkit", "run", "-np", str(ranks), *(["--gloo"] if controller == "gloo" else []), *extra]
    if hosts:
        argv += ["-H", format_hosts(hosts)]
    if network_interface:
        argv += ["--network-interface", network_interface]
    rc, text = _run(argv + ["--", python, *program], 180)
    found = re.findall(r"allreduce ok: (.*)", text)
    if rc == 0 and len(found) == ranks:
        return True, f"ok ({found[0].strip()})"
    return False, f"failed (exit {rc}): {text.strip().splitlines()[-1] if text.strip() else 'no output'}"


if __name__ == "__main__" and sys.argv[1:] == ["--versions-json"]:
    print(json.dumps(local_versions()))
