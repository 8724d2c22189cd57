"""The project's own benchmark lab: what hvdkit's docs/benchmarks.md is written from.

Not part of the installed package (setup.cfg packages ``hvdkit*`` only): run it from the repository
root as ``python -m benchmarks suite|network|predict ...`` (``make bench``, ``make bench-network``,
``make bench-predict``). A user's own cluster benchmark is ``hvdkit bench`` (``hvdkit.bench``),
which this lab builds on; ``hvdkit`` never imports ``benchmarks``.

- ``suite``: ``hvdkit bench``'s run, then the results section of docs/benchmarks.md (``docs``).
- ``network``: two emulated hosts (``netns``) joined by a shaped link, the jobs run across them
  (``network``, raw TCP reference ``tcp_stream``) and their report (``network_report``).
- ``predict``: the scaling model (``model``) checked against Horovod's published figures,
  calibrated on the suite's results and extrapolated (``predict``).

Run by hand as ``python -m benchmarks.X``: ``gpu_bench`` (Horovod-NCCL vs DDP-NCCL on this machine's
GPUs; ``scripts/gpu-proof.sh``) and ``keras_overlap`` (a worker under ``hvdkit run``: the Keras
allreduce split into groups).
"""

import contextlib
import os
import signal
from pathlib import Path

__all__ = ["ROOT", "env_with_root", "group_ended", "save_figure", "write_record"]

ROOT = Path(__file__).resolve().parents[1]


def env_with_root(env=None):
    """``env`` (default: this process's environment) with the repository root first on PYTHONPATH.

    A process started with ``python -m benchmarks.X`` then finds this package whatever its working
    directory (``benchmarks`` is not installed).
    """
    env = dict(os.environ if env is None else env)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [env.get("PYTHONPATH")])])
    return env


@contextlib.contextmanager
def group_ended(proc):
    """``with group_ended(subprocess.Popen(..., start_new_session=True)) as proc:``: however the block ends, a
    job still running then is ended with its whole process group (SIGKILL, by its pid) and reaped."""
    try:
        yield proc
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def save_figure(fig, path, dpi=110):
    """Lay out ``fig``, write it to ``path`` (PNG) and close it."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    fig.savefig(path, dpi=dpi)
    plt.close(fig)


def plot_ways(jobs, ways, labels, keys, title, path):
    """One panel per ``(key, panel title)`` of ``keys``: each job's value as a dot over its way (``ways``, named
    ``labels`` on the axis), a line at each way's median; saved to ``path``."""
    import statistics

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(keys), figsize=(12, 3.6))
    for ax, (key, panel) in zip(axes, keys, strict=True):
        for i, way in enumerate(ways):
            vals = [j[key] for j in jobs if j["way"] == way]
            ax.scatter([i] * len(vals), vals, label=way, s=28)
            ax.hlines(statistics.median(vals), i - 0.25, i + 0.25, colors="k")
        ax.set_xticks(range(len(ways)), labels, fontsize=8)
        ax.set_title(panel, fontsize=10)
        ax.set_ylim(bottom=0)
    fig.suptitle(title, fontsize=10)
    save_figure(fig, path)


def write_record(out, name, result, lines, draw, rows):
    """A lab command's record: OUT/NAME.json (``result``), the table ``lines`` on stdout, and OUT/NAME.png drawn by
    ``draw(rows, path)``; the two paths."""
    import json

    data, png = os.path.join(out, f"{name}.json"), os.path.join(out, f"{name}.png")
    with open(data, "w", encoding="utf-8") as f:
        json.dump(result, f, indent=1)
    print("\n".join(lines))
    draw(rows, png)
    return data, png
