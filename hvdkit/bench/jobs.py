"""Running benchmark jobs: the job runner of ``hvdkit bench``, with its progress lines, the machine
description and the publishing of results (JSON, table, plots, results.md). The project's network
lab (``benchmarks.network``, outside the package) runs its jobs with it too.
"""

from __future__ import annotations

import json
import os
import platform
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from types import ModuleType
from typing import Any

from ..core.devices import shared_gpu_env
from ..core.errors import LaunchError
from ..diagnostics.doctor import local_versions
from ..launcher.child import run_child
from ..launcher.plan import find_tool
from .stats import Samples, check_close, interleaved

__all__ = [
    "NETNS",
    "Suite",
    "TUNING",
    "busy_warning",
    "gpu_job_env",
    "machine",
    "netns_wrapper",
    "publish",
    "run_bench_job",
    "say",
]

# Horovod settings compared by the tuning section: (label, extra environment for the job).
TUNING = (
    ("horovod default (cycle 1 ms)", {"HOROVOD_CYCLE_TIME": "1"}),
    ("cycle 2 ms", {"HOROVOD_CYCLE_TIME": "2"}),
    ("cycle 5 ms", {"HOROVOD_CYCLE_TIME": "5"}),
)


# Runs "$@" in a new network namespace whose loopback is up: its /proc/net/dev counts that job alone.
NETNS = ("unshare", "-n", "sh", "-c", 'ip link set lo up && exec "$@"', "netns")


def netns_wrapper() -> tuple[tuple[str, ...] | None, str]:
    """(the argv prefix that runs a job in a private network namespace, or None; why not, if None).

    Needs root (or CAP_SYS_ADMIN), ``unshare`` and ``ip``; tried once with ``true``.
    """
    missing = [tool for tool in ("unshare", "ip") if shutil.which(tool) is None]
    if missing:
        return None, f"{' and '.join(missing)} not found (util-linux, iproute2)"
    try:
        probe = subprocess.run([*NETNS, "true"], capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as e:
        return None, f"unshare -n failed: {e}"
    if probe.returncode != 0:
        return None, f"unshare -n failed (exit {probe.returncode}): {probe.stderr.strip()[-300:]}"
    return NETNS, ""


def gpu_job_env(np_: int, gpus: int, nccl: tuple[int, ...]) -> tuple[dict[str, str], bool]:
    """This environment for a job of ``np_`` ranks on ``gpus`` GPUs with NCCL ``nccl``, plus what ranks
    sharing a GPU need (``hvdkit.core.devices.shared_gpu_env``); (env, whether they share)."""
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    shared = np_ > gpus
    if shared:
        extra, per_rank = shared_gpu_env(nccl)
        env.update(extra)
        if per_rank:
            env["HVDKIT_PER_RANK_HOSTID"] = "1"
    return env, shared


def say(msg: str) -> None:
    print(f"[hvdkit bench] {msg}", file=sys.stderr, flush=True)


def machine() -> dict[str, Any]:
    """What the figures were measured on."""
    cpu = "unknown"
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            cpu = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), cpu)
    except OSError:
        pass
    mem = None
    try:
        mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        pass
    return {
        "cpu": cpu,
        "cores": len(os.sched_getaffinity(0)),
        "memory_bytes": mem,
        "os": platform.platform(),
        "load_average_at_start": os.getloadavg(),
        "versions": local_versions(),
        "date": time.strftime("%Y-%m-%d %H:%M:%S %z"),
    }


def _progress(line: str) -> None:
    """Show a job's progress line (``[bench ...]``) as it comes."""
    if "[bench " in line:
        print("  " + line.split("[bench ", 1)[1].rstrip().replace("] ", ": ", 1), file=sys.stderr, flush=True)


def busy_warning(load: float, cores: int) -> str | None:
    """A warning when the machine is already busy (stray ranks, other jobs), else None."""
    if load <= 0.5 * cores:
        return None
    return (
        f"warning: the machine is busy before the suite starts (load average {load:.2f} on {cores} cores): "
        "the figures will be noisy. Stray ranks from an earlier job spin at 100 % CPU: look for "
        "them (ps aux | grep -e mpirun -e python) and run the suite on a quiet machine"
    )


def run_bench_job(
    name: str,
    argv: Sequence[str],
    path: str,
    env: Mapping[str, str] | None = None,
    timeout: float = 600,
    shown: Sequence[str] | None = None,
    error: type[Exception] = LaunchError,
    where: str = "",
) -> Any:
    """Run one benchmark job (``argv``, with ``env`` added to this environment), its output shown as
    it comes; the JSON it wrote to ``path``. A failure raises ``error`` with the command line
    (``shown``, default ``argv``) and the end of the output; ``where`` says where it ran."""
    t0 = time.perf_counter()
    done = run_child(argv, env={**os.environ, **(env or {})}, timeout=timeout, on_line=_progress)
    rc, output = done.exit_code, done.output
    if rc != 0:
        how = f"exit {rc}" + (f", stopped after its timeout of {timeout:g} s" if done.timed_out else "")
        raise error(f"benchmark job {name!r}{where} failed ({how}): {' '.join(shown or argv)}\n{output[-4000:]}")
    with open(path, encoding="utf-8") as f:
        result = json.load(f)
    say(f"{name}: done in {time.perf_counter() - t0:.0f} s")
    return result


class Suite:
    def __init__(self, out: str, np_: int, quick: bool, python: str | None = None) -> None:
        self.out, self.np, self.quick = out, np_, quick
        self.python = python or sys.executable
        self.hvdkit = find_tool("hvdkit", self.python)
        os.makedirs(os.path.join(out, "jobs"), exist_ok=True)

    def job(
        self,
        name: str,
        worker: str,
        *extra: str,
        gloo: bool = False,
        env: Mapping[str, str] | None = None,
        ranks: bool = True,
        timeout: float = 600,
        wrap: Sequence[str] = (),
    ) -> Any:
        """Run one worker (under ``hvdkit run`` unless ``ranks`` is False; the whole command after
        ``wrap``, e.g. ``NETNS``); its JSON result."""
        path = os.path.join(self.out, "jobs", f"{name}.json")  # each job's own result; results.json has them all
        cmd = [self.python, "-m", f"hvdkit.bench.{worker}", path, *(["--quick"] if self.quick else []), *extra]
        if ranks:
            cmd = [self.hvdkit, "run", "-np", str(self.np), *(["--gloo"] if gloo else []), "--", *cmd]
        return run_bench_job(name, [*wrap, *cmd], path, env, timeout)

    def zero(self) -> dict[str, Any]:
        """(h) ZeRO-1: ``zero_bench`` timed (both variants interleaved, MPI), then each variant alone
        in a job of its own for its memory, over Gloo in a private network namespace for its bytes
        on the wire (without one: memory only, and the reason)."""
        out: dict[str, Any] = {"time": self.job("zero_time", "zero_bench")}
        wrap, why = netns_wrapper()
        out["netns"] = wrap is not None
        if wrap is None:
            out["netns_note"] = f"bytes on the wire not measured: {why}"
            say(f"zero: {out['netns_note']}")
        for v in ("plain", "sharded"):
            out[v] = self.job(f"zero_{v}", "zero_bench", "--part", v, gloo=True, wrap=wrap or ())
        return out

    def startup(self, reps: int) -> dict[str, Any]:
        """(g) ``hvdkit run`` against the raw ``mpirun`` command, each starting N ranks that print their rank."""
        # One write per line: with unbuffered output, print()'s separate writes of two ranks interleave.
        probe = [self.python, "-c", "import os; os.write(1, b'RANK %s\\n' % os.environb[b'OMPI_COMM_WORLD_RANK'])"]
        mpirun = [find_tool("mpirun", self.python), "-np", str(self.np), "--bind-to", "none", "--oversubscribe"]
        if os.geteuid() == 0:
            mpirun.append("--allow-run-as-root")
        variants = {"mpirun": mpirun + probe, "hvdkit_run": [self.hvdkit, "run", "-np", str(self.np), "--", *probe]}
        samples = {v: Samples() for v in variants}
        for v, argv in variants.items():  # check, untimed: every rank started and reported
            text = subprocess.run(argv, capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL).stdout
            ranks = sorted(int(r) for r in re.findall(r"RANK (\d+)", text))
            check_close(f"startup {v} ranks", ranks, list(range(self.np)), 0)
        for _, v in interleaved(list(variants), reps):
            t0 = time.perf_counter()
            subprocess.run(variants[v], capture_output=True, timeout=120, stdin=subprocess.DEVNULL, check=True)
            samples[v].add(time.perf_counter() - t0)
        return {
            "variants": {v: s.as_dict() for v, s in samples.items()},
            "extra_s": samples["hvdkit_run"].median - samples["mpirun"].median,
        }

    def tuning(self, reps: int) -> dict[str, Any]:
        """Horovod's cycle time on this machine: training step and small-allreduce latency per setting."""
        rows = {label: {"step_s": Samples(), "allreduce_4k_s": Samples()} for label, _ in TUNING}
        for rep, (label, env) in interleaved(TUNING, reps):
            tag = f"tune-{rep}-{label.split()[1] if ' ' in label else label}".replace(".", "_")
            train = self.job(tag, "train_bench", "--reps", "3", "--only", "hvdkit", env=env)
            rows[label]["step_s"].add(train["variants"]["hvdkit"]["median_s"])
            rows[label]["allreduce_4k_s"].add(train["allreduce_4k_s"])
        return {
            label: {k: s.as_dict() for k, s in r.items()} | {"env": dict(env)}
            for (label, env), r in zip(TUNING, rows.values(), strict=True)
        }


def publish(results: dict[str, Any], out: str, reporter: ModuleType, t0: float) -> dict[str, Any]:
    """Write ``results`` (with the seconds since ``t0``) to OUT/results.json, print ``reporter``'s table,
    draw its plots and write OUT/results.md; ``results``."""
    results["seconds"] = time.perf_counter() - t0
    with open(os.path.join(out, "results.json"), "w", encoding="utf-8") as f:
        json.dump(results, f, indent=1)
    print(reporter.table(results))
    plots = reporter.plots(results, out)
    with open(os.path.join(out, "results.md"), "w", encoding="utf-8") as f:
        f.write(reporter.markdown(results, plots, docs_dir=out))
    names = ", ".join(os.path.basename(p) for p in plots)
    say(f"all done in {results['seconds']:.0f} s: {out}/results.json, results.md, {names}")
    return results
