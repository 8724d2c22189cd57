"""The step breakdown over Horovod's settings: hvdkit/Horovod beside DDP, job after job, JSON after each.

    python -m hvdkit.bench.step_sweep OUT_DIR [--device cuda|cpu] [--quick] [--budget S] [--dry-run]
    python -m hvdkit.bench.step_sweep --report OUT_DIR/step_sweep.json

Each job is one ``horovodrun -np N --gloo`` run of ``hvdkit.bench.breakdown`` (DDP, hvdkit and
bucketed hvdkit in the same processes, interleaved) with one set of Horovod variables; jobs run
in ``plan()``'s order, most useful first: hvdkit's defaults and Horovod's on ResNet-50 and the
BERT-base-sized encoder, then one variable at a time on ResNet-50 (fusion threshold, cycle time,
async completion, NCCL streams, batched device copies), a Horovod timeline, then the same on the
encoder. OUT_DIR/step_sweep.json is rewritten after every job, so a run cut off keeps what it
measured; a job that fails is recorded with its error and the next one runs (unless it was the first:
then the others are skipped, since they run the same code); with ``--budget`` a
job that would not fit in what is left (judged by the jobs before it) is recorded as skipped.
On GPU, ranks outnumbering GPUs share them (``hvdkit.core.devices.shared_gpu_env``: NCCL < 2.30
over sockets on loopback). ``hvdkit bench --breakdown`` runs the CPU plan (``--quick``: toy models).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from ..core.horovod_settings import HOROVOD_DEFAULTS
from .breakdown import PHASES
from .jobs import gpu_job_env, machine, run_bench_job, say

__all__ = ["SweepJob", "plan", "run_sweep", "table", "plot", "report", "main"]

MB = 1 << 20
GPU_STEPS = {"steps": 20, "warmup": 10, "reps": 2}
GPU_SWEEP_STEPS = {"steps": 16, "warmup": 5, "reps": 2}  # one variable changed: a few seconds a model
SWEEP = (  # (label, variables): one change at a time from hvdkit's defaults
    ("fusion 0 MB", {"HOROVOD_FUSION_THRESHOLD": "0"}),
    ("fusion 16 MB", {"HOROVOD_FUSION_THRESHOLD": str(16 * MB)}),
    ("fusion 64 MB", {"HOROVOD_FUSION_THRESHOLD": str(64 * MB)}),
    ("cycle 0.1 ms", {"HOROVOD_CYCLE_TIME": "0.1"}),
    ("cycle 1 ms", {"HOROVOD_CYCLE_TIME": "1"}),
    ("cycle 5 ms", {"HOROVOD_CYCLE_TIME": "5"}),
    ("async completion", {"HOROVOD_ENABLE_ASYNC_COMPLETION": "1"}),
    ("2 NCCL streams", {"HOROVOD_NUM_NCCL_STREAMS": "2"}),
    ("batched D2D copies", {"HOROVOD_BATCH_D2D_MEMCOPIES": "1"}),
)


@dataclass(frozen=True)
class SweepJob:
    """One job: a label, the Horovod variables it sets, the models and variants it trains."""

    label: str
    env: dict[str, str] = field(default_factory=dict)
    models: tuple[str, ...] = ("resnet50",)
    variants: tuple[str, ...] = ("ddp", "hvdkit")
    timeline: bool = False  # Horovod's timeline to OUT/timeline-<n>.json (it slows the step: its own job)
    short: bool = False  # fewer steps (GPU_SWEEP_STEPS on GPU)


def plan(device: str, quick: bool = False) -> list[SweepJob]:
    """The jobs, most useful first: on GPU the defaults on both models, then the sweep (the fusion
    threshold default is 128 MB: hvdkit's defaults are that point); on CPU the two defaults only."""
    every = ("ddp", "hvdkit", "hvdkit_bucket")
    horovod = dict(HOROVOD_DEFAULTS)  # Horovod 0.28.1's cycle time, cache and fusion threshold
    if device == "cpu":
        models = ("tiny_mlp", "tiny_bert") if quick else ("mlp",)
        return [SweepJob("hvdkit defaults", {}, models, every), SweepJob("Horovod defaults", horovod, models)]
    both = ("resnet50", "bert")
    jobs = [SweepJob("hvdkit defaults", {}, both, every), SweepJob("Horovod defaults", horovod, both)]
    jobs += [SweepJob(label, env, ("resnet50",), short=True) for label, env in SWEEP]
    jobs.append(SweepJob("timeline", {}, ("resnet50",), ("hvdkit",), timeline=True, short=True))
    jobs += [SweepJob(label, env, ("bert",), short=True) for label, env in SWEEP]
    return jobs


def _steps(device: str, quick: bool, short: bool) -> dict[str, int]:
    if device == "cuda":
        return GPU_SWEEP_STEPS if short else GPU_STEPS
    return {"steps": 4, "warmup": 2, "reps": 2} if quick else {"steps": 20, "warmup": 5, "reps": 4}


def _base_env(device: str, np_: int) -> tuple[dict[str, str], bool]:
    """The environment of every job: on GPU, what ranks sharing a GPU need; (env, shared)."""
    env = {"PYTHONUNBUFFERED": "1"}
    if device != "cuda":
        return {**env, "HVDKIT_DEVICE": "cpu"}, False
    import torch

    gpus = torch.cuda.device_count()
    try:
        nccl = torch.cuda.nccl.version()
    except (AttributeError, RuntimeError):  # a CPU build of torch (a dry run): NCCL 2.28's rules
        nccl = (2, 28, 0)
    extra, shared = gpu_job_env(np_, gpus, nccl)
    return {**env, **{k: v for k, v in extra.items() if os.environ.get(k) != v}}, shared


def _argv(job: SweepJob, path: str, device: str, np_: int, steps: dict[str, int]) -> list[str]:
    horovodrun = os.path.join(os.path.dirname(sys.executable), "horovodrun")
    worker = [sys.executable, "-m", "hvdkit.bench.breakdown", path, "--device", device]
    worker += ["--models", ",".join(job.models), "--variants", ",".join(job.variants)]
    worker += [f"--{k}={v}" for k, v in steps.items()]
    return [horovodrun, "-np", str(np_), "-H", f"localhost:{np_}", "--gloo", *worker]


def run_sweep(
    out: str, device: str = "cpu", np_: int = 2, quick: bool = False, budget: float | None = None, dry_run: bool = False
) -> dict[str, Any]:
    """Run ``plan(device, quick)``; OUT/step_sweep.json after every job; the results."""
    os.makedirs(os.path.join(out, "jobs"), exist_ok=True)
    t0 = time.monotonic()
    base, shared = _base_env(device, np_)
    jobs = plan(device, quick)
    results: dict[str, Any] = {
        "machine": machine(),
        "device": device,
        "np": np_,
        "shared_gpu": shared,
        "base_env": base,
        "plan": [j.label for j in jobs],
        "steps": {"first": _steps(device, quick, False), "sweep": _steps(device, quick, True)},
        "dry_run": dry_run,
        "jobs": [],
        "complete": False,
    }
    path = os.path.join(out, "step_sweep.json")

    def save():
        with open(path, "w", encoding="utf-8") as f:
            json.dump(results, f, indent=1)

    durations: list[tuple[tuple[str, ...], float]] = []
    for n, job in enumerate(jobs):
        entry: dict[str, Any] = asdict(job)
        results["jobs"].append(entry)
        env = {**base, **job.env}
        if job.timeline:
            env["HOROVOD_TIMELINE"] = os.path.abspath(os.path.join(out, f"timeline-{n}.json"))
        job_path = os.path.join(out, "jobs", f"breakdown-{n}.json")
        argv = _argv(job, job_path, device, np_, _steps(device, quick, job.short))
        entry["argv"] = argv
        left = None if budget is None else budget - (time.monotonic() - t0)
        guess = next((s for m, s in reversed(durations) if m == job.models), durations[-1][1] if durations else 0)
        if dry_run:
            say(f"step sweep {n + 1}/{len(jobs)} {job.label}: {' '.join(f'{k}={v}' for k, v in env.items())} {argv}")
            continue
        first_failed = n > 0 and "error" in results["jobs"][0]
        if first_failed:  # the same code runs in every job: its failure is the next job's, and time is short
            entry["skipped"] = "the first job failed (see its error)"
            save()
            continue
        if left is not None and left < 1.1 * guess + 5:
            entry["skipped"] = f"{left:.0f} s left, a job like it took {guess:.0f} s"
            say(f"step sweep: {job.label} skipped ({entry['skipped']})")
            save()
            continue
        j0 = time.monotonic()
        try:
            timeout = 600 if left is None else max(10, left)
            entry["result"] = run_bench_job(f"step sweep {n + 1}/{len(jobs)} {job.label}", argv, job_path, env, timeout)
        except Exception as e:  # noqa: BLE001 - a failed job is a result; the next one runs
            entry["error"] = str(e)[-3000:]
            say(f"step sweep: {job.label} failed: {str(e)[-300:]}")
        entry["seconds"] = time.monotonic() - j0
        durations.append((job.models, entry["seconds"]))
        save()
    results["complete"] = True
    results["seconds"] = time.monotonic() - t0
    save()
    return results


def rows(results: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per (job, model, variant) measured: phases, step, hidden comm, and DDP's step in that job."""
    out = []
    for job in results["jobs"]:
        for model, m in (job.get("result") or {}).get("models", {}).items():
            ddp = m["variants"].get("ddp", {}).get("step_mean_s")
            for variant, v in m["variants"].items():
                out.append({"job": job["label"], "model": model, "variant": variant, "ddp_step_s": ddp, **v})
    return out


def table(results: dict[str, Any]) -> str:
    """A Markdown table of the breakdown: milliseconds per phase (means), per job, model and variant."""
    head = f"Step breakdown, {results['np']} ranks on {results['device']}" + (
        " sharing a GPU" if results.get("shared_gpu") else ""
    )
    if not results.get("complete"):
        head += " -- cut off: partial results"
    lines = [
        head,
        "| job | model | variant | step ms | " + " | ".join(PHASES) + " | hidden comm | comm alone | DDP / this |",
        "| --- " * (len(PHASES) + 7) + "|",
    ]
    for r in rows(results):
        ph = r["phases_mean_s"]
        ms = lambda s: "-" if s is None else f"{s * 1e3:.1f}"  # noqa: E731 - local formatter
        ratio = f"{r['ddp_step_s'] / r['step_mean_s']:.2f}" if r["ddp_step_s"] else "-"
        cells = [r["job"], r["model"], r["variant"], ms(r["step_mean_s"]), *(ms(ph[p]) for p in PHASES)]
        cells += [ms(r["hidden_comm_s"]), ms(r["comm_alone_s"]), ratio]
        lines.append("| " + " | ".join(cells) + " |")
    for job in results["jobs"]:
        for key in ("error", "skipped"):
            if key in job:
                lines.append(f"{job['label']}: {key}: {job[key].splitlines()[0][:200] if job[key] else ''}")
    return "\n".join(lines)


def plot(results: dict[str, Any], path: str) -> str:
    """Stacked bars of the phases per (job, variant), one panel per model; hidden comm hatched over backward."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    from .report import save_figure

    all_rows = rows(results)
    models = list(dict.fromkeys(r["model"] for r in all_rows)) or ["(nothing measured)"]
    fig, axes = plt.subplots(len(models), 1, figsize=(max(8, 0.55 * len(all_rows) + 3), 4 * len(models)), squeeze=False)
    colors = dict(zip(PHASES, ("#4c72b0", "#55a868", "#c44e52", "#8172b2", "#ccb974"), strict=True))
    for ax, model in zip(axes[:, 0], models, strict=True):
        mine = [r for r in all_rows if r["model"] == model]
        xs = range(len(mine))
        bottom = [0.0] * len(mine)
        for phase in PHASES:
            heights = [r["phases_mean_s"][phase] * 1e3 for r in mine]
            ax.bar(xs, heights, 0.7, bottom=bottom, color=colors[phase], label=phase)
            bottom = [b + h for b, h in zip(bottom, heights, strict=True)]
            if phase == "forward":  # hidden comm overlaps backward: hatched from where backward starts
                hidden = [(r["hidden_comm_s"] or 0) * 1e3 for r in mine]
                ax.bar(xs, hidden, 0.7, bottom=bottom, fill=False, hatch="//", edgecolor="k", linewidth=0)
        ax.set_xticks(list(xs), [f"{r['job']}\n{r['variant']}" for r in mine], rotation=60, ha="right", fontsize=7)
        ax.set_ylabel("ms per step (mean)")
        ax.set_title(f"{model}: where a step's time goes ({results['np']} ranks, {results['device']})")
        handles, labels = ax.get_legend_handles_labels()
        handles.append(Patch(fill=False, hatch="//", label="comm hidden behind backward (estimate)"))
        ax.legend(handles=handles, fontsize=7, loc="upper left")
    return save_figure(fig, path)


def report(json_path: str) -> int:
    """Print the table of a step_sweep.json and draw step_breakdown.png beside it; the exit code."""
    try:
        with open(json_path, encoding="utf-8") as f:
            results = json.load(f)
    except (OSError, ValueError) as e:
        print(f"[step-sweep] cannot read {json_path}: {e}; give the step_sweep.json a run wrote", file=sys.stderr)
        return 2
    print(table(results))
    try:
        png = plot(results, os.path.join(os.path.dirname(json_path) or ".", "step_breakdown.png"))
        print(f"[step-sweep] plot: {png}")
    except ImportError as e:
        print(f"[step-sweep] no plot: {e}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m hvdkit.bench.step_sweep``: run the plan (or ``--report`` a run's JSON); the exit code."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out", nargs="?", help="folder for step_sweep.json, step_breakdown.png and the jobs' JSON")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("-np", "--num-proc", dest="np", type=int, default=2)
    p.add_argument("--quick", action="store_true", help="CPU: toy models, a few steps (checks, not figures)")
    p.add_argument("--budget", type=float, help="seconds the whole sweep may take: later jobs are skipped")
    p.add_argument("--dry-run", action="store_true", help="print every job's command and variables, run none")
    p.add_argument("--report", metavar="JSON", help="only print the table and draw the plot of a step_sweep.json")
    args = p.parse_args(argv)
    if args.report:
        return report(args.report)
    if not args.out:
        p.error("give OUT_DIR (or --report JSON)")
    run_sweep(args.out, args.device, args.np, args.quick, args.budget, args.dry_run)
    return 0 if args.dry_run else report(os.path.join(args.out, "step_sweep.json"))


if __name__ == "__main__":
    sys.exit(main())
