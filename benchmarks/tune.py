"""``python -m benchmarks tune``: what ``hvdkit tune`` gets out of this machine, in one run.

    python -m benchmarks tune --out docs/bench/tune-DATE [--trials 6] [--epochs 3]

Three studies of the same budget (``--trials`` trials of examples/tune_digits.py, ``-np 1``, no
pruning, one parameter: ``lr`` on a log scale), one after the other through the real CLI:
``--parallel 1`` and ``--parallel 2`` with the same seed (the sampler proposes the same learning
rates in the same order, so the two do the same work), and a grid of the same budget (log-spaced
learning rates enqueued in the study before ``hvdkit tune --parallel 2`` runs it). Writes
OUT/tune.json (the machine, its load, each study's wall time, trials per hour, trials and best
value), OUT/tune.png and OUT/tune.md (the table), and keeps each study's folder (trials.csv,
best.json, the plots; the trials' checkpoints are removed).
"""

import argparse
import csv
import json
import math
import os
import shutil
import subprocess
import sys
import time

from hvdkit.bench.jobs import busy_warning, machine, say

__all__ = ["main", "grid", "table"]

LOW, HIGH = 1.0e-3, 0.5
STUDIES = (("parallel1", 1, False), ("parallel2", 2, False), ("grid", 2, True))


def grid(n, low=LOW, high=HIGH):
    """``n`` learning rates spaced evenly on a log scale from ``low`` to ``high`` (both included)."""
    if n == 1:
        return [math.sqrt(low * high)]
    return [low * (high / low) ** (i / (n - 1)) for i in range(n)]


def _enqueue_grid(out, values):
    """The study of ``hvdkit tune --out OUT``, created with the grid enqueued (asked for first, in order)."""
    import optuna
    from optuna.storages.journal import JournalFileBackend

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    storage = optuna.storages.JournalStorage(JournalFileBackend(os.path.join(out, "study.journal")))
    study = optuna.create_study(storage=storage, study_name="hvdkit-tune", direction="minimize")
    for lr in values:
        study.enqueue_trial({"lr": lr})


def _run_study(name, out, space, trials, parallel, epochs, is_grid):
    folder = os.path.join(out, name)
    shutil.rmtree(folder, ignore_errors=True)
    os.makedirs(folder)
    if is_grid:
        _enqueue_grid(folder, grid(trials))
    argv = [sys.executable, "-m", "hvdkit", "tune", "--space", space, "--metric", "val_loss", "--mode", "min"]
    argv += ["--trials", str(trials), "--parallel", str(parallel), "-np", "1", "--pruner", "none", "--seed", "0"]
    argv += ["--out", folder, "--status-interval", "60", "--", sys.executable, "examples/tune_digits.py"]
    argv += ["--epochs", str(epochs), "--checkpoint-dir", "{trial_dir}/ckpt"]
    say(f"tune: {name}: {trials} trials, --parallel {parallel}{' (grid)' if is_grid else ''}")
    t0 = time.perf_counter()
    with subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as proc:
        lines = []
        for line in proc.stdout:
            lines.append(line)
            if line.startswith(("trial ", "[status]")):
                say(f"tune: {name}: {line.rstrip()}")
        code = proc.wait()
    wall = time.perf_counter() - t0
    if code != 0:
        raise RuntimeError(f"{name}: hvdkit tune exited {code}:\n{''.join(lines[-30:])}")
    for ckpt in (os.path.join(folder, "trials", t, "ckpt") for t in os.listdir(os.path.join(folder, "trials"))):
        shutil.rmtree(ckpt, ignore_errors=True)  # the checkpoints are not results
    with open(os.path.join(folder, "trials.csv"), newline="", encoding="utf-8") as f:
        rows = [r for r in csv.DictReader(f) if r["state"] == "COMPLETE"]
    with open(os.path.join(folder, "best.json"), encoding="utf-8") as f:
        best = json.load(f)
    return {
        "parallel": parallel,
        "grid": is_grid,
        "wall_s": wall,
        "trials_complete": len(rows),
        "trials_per_hour": 3600.0 * len(rows) / wall,
        "mean_trial_s": sum(float(r["duration_s"]) for r in rows) / max(1, len(rows)),
        "best_value": best["value"],
        "best_lr": best["params"]["lr"],
        "trials": [
            {"lr": float(r["lr"]), "val_loss": float(r["value"]), "seconds": float(r["duration_s"])} for r in rows
        ],
    }


def table(results):
    """The markdown table of ``results`` (tune.json's ``studies``)."""
    lines = [
        "| study | parallel | trials | wall s | trials/hour | mean trial s | best val_loss | at lr |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, s in results.items():
        lines.append(
            f"| {name} | {s['parallel']} | {s['trials_complete']} | {s['wall_s']:.0f} | {s['trials_per_hour']:.0f} | "
            f"{s['mean_trial_s']:.1f} | {s['best_value']:.4f} | {s['best_lr']:.4g} |"
        )
    return lines


def plot(results, path):
    """tune.png: trials per hour by study, and every trial's val_loss against its lr (search vs grid)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    names = list(results)
    a.bar(names, [results[n]["trials_per_hour"] for n in names], color=["C0", "C1", "C2"][: len(names)])
    a.set_ylabel("trials per hour")
    a.set_title("hvdkit tune throughput (-np 1 trials)")
    for name, color, marker in (("parallel2", "C1", "o"), ("grid", "C2", "s")):
        if name in results:
            t = results[name]["trials"]
            b.scatter([x["lr"] for x in t], [x["val_loss"] for x in t], color=color, marker=marker, label=name)
    b.set_xscale("log")
    b.set_xlabel("lr")
    b.set_ylabel("val_loss (last epoch)")
    b.set_title("search (TPE, seed 0) vs grid, same budget")
    b.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv=None):
    """Run the three studies into ``--out``; the exit code."""
    p = argparse.ArgumentParser(prog="python -m benchmarks tune", description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, help="folder for tune.json, tune.png, tune.md and the studies")
    p.add_argument("--trials", type=int, default=6, help="trials per study (default 6)")
    p.add_argument("--epochs", type=int, default=3, help="epochs per trial (default 3)")
    args = p.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    m = machine()
    busy = busy_warning(m["load_average_at_start"][0], m["cores"])
    if busy:
        say(busy)
    space = os.path.join(args.out, "space.yaml")
    with open(space, "w", encoding="utf-8") as f:
        f.write(f"lr: {{type: float, low: {LOW}, high: {HIGH}, log: true}}\n")
    t0 = time.perf_counter()
    studies = {}
    for name, parallel, is_grid in STUDIES:
        studies[name] = _run_study(name, args.out, space, args.trials, parallel, args.epochs, is_grid)
    result = {
        "machine": m,
        "load_average_at_end": os.getloadavg(),
        "trials": args.trials,
        "epochs": args.epochs,
        "command": "examples/tune_digits.py -np 1, --pruner none, lr log-uniform in [0.001, 0.5]",
        "studies": studies,
        "parallel2_over_parallel1": studies["parallel2"]["trials_per_hour"] / studies["parallel1"]["trials_per_hour"],
        "seconds": time.perf_counter() - t0,
    }
    with open(os.path.join(args.out, "tune.json"), "w", encoding="utf-8") as f:
        json.dump(result, f, indent=1)
    rows = table(studies)
    with open(os.path.join(args.out, "tune.md"), "w", encoding="utf-8") as f:
        f.write("\n".join(rows) + "\n")
    print("\n".join(rows))
    plot(studies, os.path.join(args.out, "tune.png"))
    say(
        f"tune: done in {result['seconds']:.0f} s: parallel 2 / parallel 1 = {result['parallel2_over_parallel1']:.2f}x "
        f"trials per hour; {args.out}/tune.json, tune.png, tune.md"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
