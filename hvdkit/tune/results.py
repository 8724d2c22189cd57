"""A study's results: the table on stdout, ``OUT/trials.csv``, ``OUT/best.json`` and PNG plots."""

from __future__ import annotations

import csv
import json
import math
import os
from collections.abc import Sequence
from typing import Any, TextIO

__all__ = [
    "KEY_ATTR",
    "ATTEMPT_ATTR",
    "ERROR_ATTR",
    "rows_of",
    "format_table",
    "write_csv",
    "write_best",
    "write_plots",
    "write_results",
]

KEY_ATTR = "hvdkit_key"  # the number of the first attempt of a parameter set (its folder trials/KEY)
ATTEMPT_ATTR = "hvdkit_attempt"  # 1 for the first attempt, 2 for the first retry, ...
ERROR_ATTR = "hvdkit_error"  # why an attempt failed: the last lines of its output
COLUMNS = ("number", "state", "value", "duration_s", "attempt", "key")


def rows_of(trials: Sequence[Any], param_names: Sequence[str]) -> list[dict[str, Any]]:
    """One dict per Optuna FrozenTrial: number, state, value, duration_s, attempt, key, the params, error
    (why a FAIL failed: a line, then its output's last lines)."""
    rows = []
    for t in sorted(trials, key=lambda t: t.number):
        start, end = t.datetime_start, t.datetime_complete
        row = {
            "number": t.number,
            "state": t.state.name,
            "value": t.value if t.state.name == "COMPLETE" else _last_intermediate(t),
            "duration_s": round((end - start).total_seconds(), 2) if start and end else None,
            "attempt": t.user_attrs.get(ATTEMPT_ATTR),
            "key": t.user_attrs.get(KEY_ATTR),
        }
        for name in param_names:
            row[name] = t.params.get(name)
        row["error"] = t.user_attrs.get(ERROR_ATTR) or ""
        rows.append(row)
    return rows


def _last_intermediate(t):
    if not t.intermediate_values:
        return None
    return t.intermediate_values[max(t.intermediate_values)]


def _cell(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return "nan" if math.isnan(v) else f"{v:.6g}"
    return str(v)


def format_table(rows: Sequence[dict[str, Any]], param_names: Sequence[str], metric: str) -> str:
    """A plain-text table: number, params, the metric (a PRUNED trial's last reported value), state, seconds."""
    header = ["#", *param_names, metric, "state", "seconds"]
    body = [
        [_cell(r["number"]), *(_cell(r[p]) for p in param_names), _cell(r["value"]), r["state"], _cell(r["duration_s"])]
        for r in rows
    ]
    widths = [max(len(line[i]) for line in [header, *body]) for i in range(len(header))]
    lines = ["  ".join(c.rjust(w) for c, w in zip(line, widths, strict=True)) for line in [header, *body]]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def write_csv(path: str, rows: Sequence[dict[str, Any]], param_names: Sequence[str]) -> None:
    """``trials.csv``: the columns of ``rows_of`` (params by name, ``error`` last), one row per trial."""
    fields = [*COLUMNS, *param_names, "error"]
    tmp = path + ".tmp"
    with open(tmp, "w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        for r in rows:
            w.writerow({k: ("" if r.get(k) is None else r.get(k)) for k in fields})
    os.replace(tmp, path)


def write_best(path: str, study: Any, metric: str, mode: str) -> dict[str, Any] | None:
    """``best.json``: the best COMPLETE trial's ``{"number", "value", "params", "metric", "mode", "study"}``;
    None (and no file) while no trial is complete."""
    complete = [t for t in study.get_trials(deepcopy=False) if t.state.name == "COMPLETE"]
    if not complete:
        return None
    best = (min if mode == "min" else max)(complete, key=lambda t: t.value)
    data = {
        "study": study.study_name,
        "metric": metric,
        "mode": mode,
        "number": best.number,
        "value": best.value,
        "params": best.params,
    }
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(data, f, indent=2)
        f.write("\n")
    os.replace(tmp, path)
    return data


def write_plots(out: str, study: Any, metric: str, mode: str) -> list[str]:
    """``history.png`` (every finished trial's value and the best so far) and, with 2+ complete trials,
    ``importance.png`` (Optuna's parameter importances); the paths written."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    done = [t for t in study.get_trials(deepcopy=False) if t.state.name in ("COMPLETE", "PRUNED")]
    complete = [t for t in done if t.state.name == "COMPLETE"]
    fig, ax = plt.subplots(figsize=(7, 4))
    for state, marker in (("COMPLETE", "o"), ("PRUNED", "x")):
        pts = [
            (t.number, _last_intermediate(t) if state == "PRUNED" else t.value) for t in done if t.state.name == state
        ]
        pts = [(n, v) for n, v in pts if v is not None]
        if pts:
            ax.scatter(*zip(*pts, strict=True), marker=marker, label=state.lower())
    best, line = None, []
    for t in sorted(complete, key=lambda t: t.number):
        best = t.value if best is None else (min if mode == "min" else max)(best, t.value)
        line.append((t.number, best))
    if line and done:
        line.append((max(t.number for t in done), best))  # the best so far, up to the last finished trial
        ax.step(*zip(*line, strict=True), where="post", color="C3", label=f"best ({mode})")
    ax.set_xlabel("trial")
    ax.set_ylabel(metric)
    ax.set_title(f"{study.study_name}: optimization history")
    if ax.get_legend_handles_labels()[0]:  # nothing finished yet: an empty plot, no empty legend
        ax.legend()
    fig.tight_layout()
    written.append(os.path.join(out, "history.png"))
    fig.savefig(written[-1], dpi=100)
    plt.close(fig)
    importances = _importances(study, complete)
    if importances:
        fig, ax = plt.subplots(figsize=(7, 1.2 + 0.5 * len(importances)))
        names = list(importances)[::-1]
        ax.barh(names, [importances[n] for n in names])
        ax.set_xlabel(f"importance for {metric}")
        ax.set_title(f"{study.study_name}: parameter importances")
        fig.tight_layout()
        written.append(os.path.join(out, "importance.png"))
        fig.savefig(written[-1], dpi=100)
        plt.close(fig)
    return written


def _importances(study, complete):
    if len(complete) < 2:
        return {}
    try:
        from optuna.importance import get_param_importances

        return get_param_importances(study)
    except (RuntimeError, ValueError):  # e.g. every complete trial had the same parameters
        return {}


def write_results(study: Any, cfg: Any, stream: TextIO) -> None:
    """The table on ``stream``, then ``trials.csv``, ``best.json`` and the plots in ``cfg.out``."""
    names = cfg.space.names()
    rows = rows_of(study.get_trials(deepcopy=False), names)
    stream.write("\n" + format_table(rows, names, cfg.metric) + "\n")
    write_csv(os.path.join(cfg.out, "trials.csv"), rows, names)
    best = write_best(os.path.join(cfg.out, "best.json"), study, cfg.metric, cfg.mode)
    plots = write_plots(cfg.out, study, cfg.metric, cfg.mode)
    if best:
        stream.write(f"best: trial {best['number']} {cfg.metric} {best['value']:.6g} with {best['params']}\n")
    else:
        stream.write("no trial is complete yet: no best.json\n")
    files = ["best.json"] if best else []
    stream.write(f"wrote {', '.join([os.path.join(cfg.out, 'trials.csv'), *files, *map(os.path.basename, plots)])}\n")
    stream.flush()
