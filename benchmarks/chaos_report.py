"""The pure part of ``python -m benchmarks chaos``: the schedule, the sample check, the statistics,
the table and the plot. No processes; every function takes the worker's step records (dicts with
``t``, ``pid``, ``rank``, ``size``, ``epoch``, ``step``, ``ids``) and returns plain data.

The schedule: with a fixed global batch the training visits, epoch after epoch, the samples in the
order ``hvdkit.core.data.epoch_order(n, seed, epoch)``, cut into optimizer steps by
``step_bounds`` from offset 0 (a resume at any world size continues at a step boundary). Global step
``k`` (1 for the first) is step ``(k - 1) % S`` of epoch ``(k - 1) // S``, S steps per epoch. Useful
work is counted by the step index the training reached, so a step computed again after a fault
adds nothing.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from hvdkit.core.data import epoch_order, step_bounds

__all__ = [
    "Schedule",
    "last_runs",
    "check_samples",
    "recovery",
    "percentile",
    "useful_series",
    "way_summary",
    "table",
    "plot",
]


@dataclass(frozen=True)
class Schedule:
    """Which samples global step ``k`` trains on: ``n`` samples, ``global_batch_size`` a step in ``slots`` parts."""

    n: int
    global_batch_size: int
    slots: int
    seed: int = 0
    drop_last: bool = False

    @property
    def bounds(self) -> list[tuple[int, int]]:
        """Each step's ``(begin, end)`` positions in an epoch's order (the same every epoch)."""
        return step_bounds(self.n, 0, self.global_batch_size, self.slots, self.drop_last)

    @property
    def steps_per_epoch(self) -> int:
        return len(self.bounds)

    def where(self, step: int) -> tuple[int, int]:
        """``(epoch, index of the step in it)`` of global step ``step`` (1-based)."""
        return divmod(step - 1, self.steps_per_epoch)

    def ids(self, step: int) -> list[int]:
        """The sample indices of global step ``step``."""
        epoch, i = self.where(step)
        begin, end = self.bounds[i]
        return [int(v) for v in epoch_order(self.n, self.seed, epoch)[begin:end]]

    def samples_through(self, step: int) -> int:
        """Samples of steps 1..``step`` together."""
        if step <= 0:
            return 0
        sizes = [end - begin for begin, end in self.bounds]
        epochs, rest = divmod(step, len(sizes))
        return epochs * sum(sizes) + sum(sizes[:rest])


def last_runs(records: Iterable[Mapping]) -> dict[int, list[Mapping]]:
    """Each step's records of its last run: the last ``size`` records of the step in time order.

    A step can run more than once: a fault cuts it short or a recovery goes back past it. The run
    that counts is the one the training went on from, the last; its ``size`` ranks each wrote one
    record (the check below reports a run whose ranks do not add up).
    """
    by_step = defaultdict(list)
    for r in records:
        by_step[r["step"]].append(r)
    out = {}
    for step, rs in by_step.items():
        rs.sort(key=lambda r: r["t"])
        out[step] = rs[-rs[-1]["size"] :]
    return out


def check_samples(records: Iterable[Mapping], schedule: Schedule) -> dict:
    """Did each step's last run train on exactly the schedule's samples, each once? A dict:

    ``ok``, ``steps`` (checked), ``epochs_complete`` (every step of the epoch seen, so every sample
    of it used once), ``last_step`` and ``problems`` (the first 10, one line each).
    """
    runs = last_runs(records)
    problems, bad = [], set()
    for step in sorted(runs):
        rs = runs[step]
        size = rs[-1]["size"]
        ranks = sorted(r["rank"] for r in rs)
        if ranks != list(range(size)) or any(r["size"] != size for r in rs):
            problems.append(f"step {step}: its last run has ranks {ranks} at sizes {sorted({r['size'] for r in rs})}")
            bad.add(step)
            continue
        got = sorted(i for r in rs for i in r["ids"])
        want = sorted(schedule.ids(step))
        if got != want:
            dup = len(got) - len(set(got))
            problems.append(
                f"step {step}: trained on {len(got)} samples ({dup} repeated, {len(set(got) - set(want))} not of "
                "this step), "
                f"the schedule has {len(want)} ({len(set(want) - set(got))} of them missing)"
            )
            bad.add(step)
    last = max(runs, default=0)
    missing = sorted(set(range(1, last + 1)) - set(runs))
    if missing:
        problems.append(f"steps never recorded: {_ranges(missing)}")
    bad.update(missing)
    complete = sum(1 for e in range(last // schedule.steps_per_epoch) if not _has_step_of(bad, e, schedule))
    return {
        "ok": not problems,
        "steps": len(runs),
        "last_step": last,
        "epochs_complete": complete,
        "problems": problems[:10],
    }


def _has_step_of(steps, epoch, schedule):
    return any(schedule.where(s)[0] == epoch for s in steps)


def _ranges(values):
    parts, start = [], None
    for a, b in zip(values, [*values[1:], None], strict=True):
        start = a if start is None else start
        if b != a + 1:
            parts.append(str(start) if start == a else f"{start}-{a}")
            start = None
    return ", ".join(parts[:5]) + (" ..." if len(parts) > 5 else "")


def recovery(records: Sequence[Mapping], killed_at: float) -> dict | None:
    """The first step after a kill at ``killed_at`` that the job's new world took; None before it.

    The world before the kill: the processes of the last ``size`` records before it (each rank
    logs every step). A step after the kill counts as recovered when another world took it (another
    size, or a process not in the old world) or when a process takes a step it had taken before
    the kill (it went back to a commit): a step the old world ends just after the kill is not a
    recovery. ``{"at", "step", "reached", "lost", "seconds"}``: ``reached`` is the step of the last
    record before the kill, ``lost`` the steps of the old world done again.
    """
    before = sorted((r for r in records if r["t"] <= killed_at), key=lambda r: r["t"])
    if not before:
        return None
    size = before[-1]["size"]
    world = before[-size:]
    pids, reached = {r["pid"] for r in world}, before[-1]["step"]
    seen = {(r["pid"], r["step"]) for r in before}
    for r in sorted((r for r in records if r["t"] > killed_at), key=lambda r: r["t"]):
        if r["size"] != size or r["pid"] not in pids or (r["pid"], r["step"]) in seen:
            return {
                "at": r["t"],
                "step": r["step"],
                "reached": reached,
                "lost": max(0, reached - (r["step"] - 1)),
                "seconds": r["t"] - killed_at,
            }
    return None


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile of ``values`` (linear between the nearest ranks, as numpy's default); NaN for none."""
    if not values:
        return math.nan
    return float(np.percentile(np.asarray(values, dtype=float), q))


def useful_series(records: Sequence[Mapping], schedule: Schedule, t0: float, t1: float, bin_s: float) -> list[dict]:
    """Useful throughput over ``[t0, t1)`` in bins of ``bin_s`` seconds: ``[{"t", "samples_per_s"}, ...]``.

    A bin's useful samples are those of the steps the training reached beyond the highest step
    reached before the bin (a step taken again adds nothing); ``t`` is the bin's end, from ``t0``
    (the last bin ends at ``t1``, and may be shorter).
    """
    events = sorted((r["t"], r["step"]) for r in records if r["t"] < t1)
    out, reached, i, start = [], 0, 0, t0
    for k in range(1, max(0, math.ceil((t1 - t0) / bin_s - 1e-6)) + 1):
        edge = min(t0 + k * bin_s, t1)
        before = schedule.samples_through(reached)
        while i < len(events) and events[i][0] < edge:
            reached = max(reached, events[i][1])
            i += 1
        rate = (schedule.samples_through(reached) - before) / (edge - start)
        out.append({"t": round(edge - t0, 3), "samples_per_s": round(rate, 3)})
        start = edge
    return out


def way_summary(
    way: str, records: Sequence[Mapping], faults: Sequence[Mapping], schedule: Schedule, t0: float, t1: float
) -> dict:
    """One way's figures over its window ``[t0, t1]``: useful throughput, recoveries, lost steps, the sample check."""
    inside = [r for r in records if r["t"] <= t1]
    reached = max((r["step"] for r in inside), default=0)
    executed = sum(1 for r in inside if r["rank"] == 0)
    done = [f for f in faults if f.get("recovery")]
    seconds = [f["recovery"]["seconds"] for f in done]
    lost = [f["recovery"]["lost"] for f in done]
    return {
        "way": way,
        "window_s": round(t1 - t0, 3),
        "steps_reached": reached,
        "steps_run": executed,
        "useful_samples": schedule.samples_through(reached),
        "useful_samples_per_s": round(schedule.samples_through(reached) / (t1 - t0), 3) if t1 > t0 else math.nan,
        "faults": len(faults),
        "faults_recovered": len(done),
        "recovery_s_median": round(percentile(seconds, 50), 3) if seconds else None,
        "recovery_s_p95": round(percentile(seconds, 95), 3) if seconds else None,
        "steps_lost_per_fault": round(sum(lost) / len(lost), 3) if lost else None,
        "samples": check_samples(records, schedule),
    }


def _fmt(value, digits=1):
    return "-" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:.{digits}f}"


def table(summary: Mapping) -> str:
    """The markdown table of ``summary["ways"]`` (one row per way, throughput relative to the fault-free run)."""
    ways = summary["ways"]
    base = next((w["useful_samples_per_s"] for w in ways if w["way"] == "none"), None)
    rows = [
        "| way | useful samples/s | vs fault-free | faults (recovered) | recovery median (s) | recovery p95 (s) "
        "| steps lost per fault | every sample once per epoch |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for w in ways:
        ratio = f"{100 * w['useful_samples_per_s'] / base:.1f} %" if base else "-"
        check = w["samples"]
        once = f"{'yes' if check['ok'] else 'NO'} ({check['epochs_complete']} epochs)"
        rows.append(
            f"| {w['way']} | {_fmt(w['useful_samples_per_s'])} | {ratio} | "
            f"{w['faults']} ({w['faults_recovered']}) | {_fmt(w['recovery_s_median'])} | {_fmt(w['recovery_s_p95'])} | "
            f"{_fmt(w['steps_lost_per_fault'])} | {once} |"
        )
    return "\n".join(rows) + "\n"


def plot(summary: Mapping, path: str) -> None:
    """Useful throughput over time per way, the faults marked; a PNG at ``path``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ways = summary["ways"]
    fig, axes = plt.subplots(len(ways), 1, figsize=(7, 1.9 * len(ways) + 0.6), sharex=True, squeeze=False)
    for ax, w, color in zip(axes[:, 0], ways, ("C0", "C1", "C2", "C3")[: len(ways)], strict=True):
        xs = [p["t"] for p in w["series"]]
        ax.step(xs, [p["samples_per_s"] for p in w["series"]], where="pre", color=color)
        for f in w["fault_times"]:
            ax.axvline(f, color="red", lw=0.8, alpha=0.6)
        ax.set_ylabel("samples/s")
        ax.set_title(f"{w['way']}: {w['useful_samples_per_s']:.0f} useful samples/s, {w['faults']} faults", fontsize=9)
    axes[-1, 0].set_xlabel(f"seconds from the first step at 2 ranks (bins of {summary['bin_s']:g} s; red: SIGKILL)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
