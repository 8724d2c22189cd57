"""Turning the suite's results into goals, a table, plots and a Markdown summary (OUT/results.md)."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = [
    "PLOTS",
    "goals",
    "table",
    "plots",
    "markdown",
    "compression_advice",
    "zero_summary",
    "zero_table",
    "zero_plot",
]

PLOTS = ("bandwidth.png", "scaling.png", "zero.png")  # what plots() draws into the results folder
MB = 1 << 20


def save_figure(fig: Figure, path: str, dpi: int = 110) -> str:
    """Lay out ``fig``, write it to ``path`` (PNG) and free it; ``path``."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    fig.savefig(path, dpi=dpi)
    plt.close(fig)
    return path


def _median(section, variant):
    return section["variants"][variant]["median_s"]


def _sweep(results, job, variant):
    """{bytes: row} of one variant in one comm job."""
    return {r["bytes"]: r for r in results[job]["sweep"] if r["variant"] == variant}


def compression_advice(results: dict[str, Any], job: str, min_bytes: int = MB, margin: float = 0.9) -> list[int]:
    """Sizes where fp16 compression paid in ``job``: [] means do not compress on this machine.

    Only bandwidth-bound sizes count (>= ``min_bytes``: below that an allreduce costs Horovod's
    cycle time, whatever its size), and only a clear gain (fp16 time < ``margin`` x fp32 time).
    """
    c = results[job]["controller"]
    plain, fp16 = _sweep(results, job, f"hvd_{c}"), _sweep(results, job, f"hvd_{c}_fp16")
    return [n for n in sorted(plain) if n >= min_bytes and fp16[n]["median_s"] < margin * plain[n]["median_s"]]


def goals(results: dict[str, Any]) -> list[dict[str, Any]]:
    """The issue's goals as measured ratios: [{name, value, target, met}]."""
    t = results["train_torch"]
    hvdkit, horovod, ddp = (_median(t, v) for v in ("hvdkit", "horovod", "ddp"))
    largest = max(r["bytes"] for r in results["comm_mpi"]["sweep"])
    wire = [
        r["value"]
        for job in ("comm_mpi", "comm_gloo")
        for r in results[job]["sweep"]
        if r["variant"] == "fp16_wire_ratio"
    ]
    rows = [
        ("hvdkit / raw Horovod training throughput", horovod / hvdkit, ">= 0.99", horovod / hvdkit >= 0.99),
        ("hvdkit per-step overhead vs raw Horovod", hvdkit / horovod - 1, "<= 0.01", hvdkit / horovod - 1 <= 0.01),
        ("hvdkit (MPI) / torch DDP (gloo) throughput", ddp / hvdkit, ">= 1.0", ddp / hvdkit >= 1.0),
        (
            f"Horovod MPI bus bandwidth / memcpy at {largest // MB} MB",
            _sweep(results, "comm_mpi", "hvd_mpi")[largest]["fraction_of_memcpy"],
            "report",
            None,
        ),
        (
            f"Horovod Gloo bus bandwidth / memcpy at {largest // MB} MB",
            _sweep(results, "comm_gloo", "hvd_gloo")[largest]["fraction_of_memcpy"],
            "report",
            None,
        ),
        ("fp16 bytes on the wire / fp32 (every size)", max(wire), "== 0.5", all(w == 0.5 for w in wire)),
        (
            "hvdkit checkpoint save / torch.save + fsync",
            results["checkpoint"]["hvdkit_vs_torch_save_fsync"],
            "<= 1.10",
            results["checkpoint"]["hvdkit_vs_torch_save_fsync"] <= 1.10,
        ),
        (
            "hvdkit run start-up - raw mpirun (s)",
            results["startup"]["extra_s"],
            "<= 0.3",
            results["startup"]["extra_s"] <= 0.3,
        ),
    ]
    if "zero" in results:
        z = zero_summary(results["zero"])
        target = 1 / results["ranks"] + 0.01
        rows += [
            (
                "ZeRO-1 Adam state per rank / unsharded",
                z["state_ratio"],
                f"<= {target:.2f}",
                z["state_ratio"] <= target,
            ),
            ("ZeRO-1 peak resident memory per rank / unsharded", z["peak_ratio"], "report", None),
            ("ZeRO-1 / unsharded training throughput", z["throughput_ratio"], "report", None),
        ]
    return [{"name": n, "value": v, "target": tg, "met": m} for n, v, tg, m in rows]


def zero_summary(zero: dict[str, Any]) -> dict[str, Any]:
    """Section (h) in figures: per variant the state, resident and peak bytes (the largest rank's),
    step time, wire bytes (measured; None without a private network namespace) and the ring
    formula's; and the sharded / plain ratios."""
    t = zero["time"]
    rows = {}
    for v in ("plain", "sharded"):
        part = zero[v]
        wire = part.get("wire")
        rows[v] = {
            "state_bytes": max(r["state_bytes"] for r in part["ranks"]),
            "rss_model_bytes": max(r["rss_model_bytes"] for r in part["ranks"]),
            "rss_end_bytes": max(r["rss_end_bytes"] for r in part["ranks"]),
            "peak_rss_bytes": max(r["peak_rss_bytes"] for r in part["ranks"]),
            "peak_growth_bytes": max(part["peak_growth_bytes"]),
            "step_s": t["variants"][v]["median_s"],
            "spread": t["variants"][v]["spread"],
            "gloo_step_s": part["step_s"],
            "wire_bytes": wire["raw_bytes_per_rank_per_step"] if wire else None,
            "wire_bytes_idle_corrected": wire["bytes_per_rank_per_step"] if wire else None,
            "formula_bytes": t["ring_bytes_sent_per_step"][v],
        }
    p, s = rows["plain"], rows["sharded"]

    def over(key):
        return s[key] / p[key] if p[key] else None

    return {
        "parameters": t["model"]["parameters"],
        "variants": rows,
        "state_ratio": over("state_bytes"),
        "rss_end_ratio": over("rss_end_bytes"),
        "peak_ratio": over("peak_rss_bytes"),
        "throughput_ratio": p["step_s"] / s["step_s"],
        "wire_ratio": over("wire_bytes") if p["wire_bytes"] and s["wire_bytes"] else None,
        "comm_ratio": (
            t["comm_only"]["reducescatter_allgather"]["median_s"] / t["comm_only"]["allreduce"]["median_s"]
            if "comm_only" in t
            else None
        ),
        "checks": t["checks"],
    }


def zero_table(zero: dict[str, Any], ranks: int) -> list[str]:
    """Section (h) as lines of the table."""
    z = zero_summary(zero)
    lines = [
        f"\n(h) ZeRO-1 optimizer state sharding, Adam, {z['parameters'] / 1e6:.1f} M parameters, "
        f"{ranks} ranks: per rank, MB",
        f"  {'':>8} {'state':>8} {'RSS end':>8} {'peak RSS':>9} {'ms/step':>9} {'(gloo)':>8} "
        f"{'wire/step':>10} {'formula':>8}",
    ]
    for v, r in z["variants"].items():
        wire = f"{r['wire_bytes'] / MB:10.2f}" if r["wire_bytes"] is not None else f"{'-':>10}"
        lines.append(
            f"  {v:>8} {r['state_bytes'] / MB:8.1f} {r['rss_end_bytes'] / MB:8.1f} {r['peak_rss_bytes'] / MB:9.1f} "
            f"{r['step_s'] * 1e3:6.0f}±{r['spread']:.0%} {r['gloo_step_s'] * 1e3:8.0f} {wire} "
            f"{r['formula_bytes'] / MB:8.2f}"
        )
    wire = f"{z['wire_ratio']:.3f}" if z["wire_ratio"] is not None else "not measured"
    lines.append(
        f"  sharded / plain: state {z['state_ratio']:.3f}, RSS end {z['rss_end_ratio']:.3f}, "
        f"peak RSS {z['peak_ratio']:.3f}, throughput {z['throughput_ratio']:.3f}, wire bytes {wire}"
    )
    if z["comm_ratio"] is not None:
        lines.append(f"  the flat gradient alone: reduce-scatter + all-gather / allreduce {z['comm_ratio']:.2f} (time)")
    overlap = (zero.get("time") or {}).get("overlap")
    if overlap:
        rounds = overlap.get("rounds") or {}
        lines.append(
            f"  reduce-scatter overlapped with backward: throughput {overlap['speedup']:.3f}x the same sharded "
            f"step without overlap ({rounds.get('overlapped', '?')} of {rounds.get('rounds', '?')} rounds started "
            "in backward)"
        )
    if not zero.get("netns", True):
        lines.append(f"  {zero.get('netns_note', '')}")
    return lines


def zero_plot(zero: dict[str, Any], path: str) -> str:
    """Section (h) drawn to ``path``: memory per rank and step time, sharded vs plain; ``path``."""
    import matplotlib.pyplot as plt

    z = zero_summary(zero)
    rows = z["variants"]
    fig, (mem, step) = plt.subplots(1, 2, figsize=(12, 4.5))
    kinds = (("state_bytes", "optimizer state"), ("rss_end_bytes", "resident after steps"), ("peak_rss_bytes", "peak"))
    width = 0.38
    for i, (v, color) in enumerate((("plain", "#888"), ("sharded", "#3b7"))):
        xs = [k + (i - 0.5) * width for k in range(len(kinds))]
        bars = mem.bar(xs, [rows[v][key] / MB for key, _ in kinds], width, label=v, color=color)
        mem.bar_label(bars, fmt="%.0f", fontsize=8)
    mem.set_xticks(range(len(kinds)), [label for _, label in kinds])
    mem.set_ylabel("MB per rank (largest rank)")
    mem.set_title(f"memory, Adam, {z['parameters'] / 1e6:.1f} M parameters")
    mem.legend(fontsize=8)
    labels = ["plain\n(MPI)", "sharded\n(MPI)", "plain\n(Gloo)", "sharded\n(Gloo)"]
    values = [
        rows["plain"]["step_s"],
        rows["sharded"]["step_s"],
        rows["plain"]["gloo_step_s"],
        rows["sharded"]["gloo_step_s"],
    ]
    bars = step.bar(range(4), [x * 1e3 for x in values], color=["#888", "#3b7", "#888", "#3b7"])
    step.bar_label(bars, fmt="%.0f", fontsize=8)
    step.set_xticks(range(4), labels, fontsize=8)
    step.set_ylabel("ms per step (median)")
    step.set_title("step time: sharded vs plain")
    return save_figure(fig, path)


def _fmt_bytes(n):
    return f"{n // MB} MB" if n >= MB else f"{n >> 10} KB"


def _spread(section, v):
    return f"{section['variants'][v]['spread']:.0%}"


def table(results: dict[str, Any]) -> str:
    """The plain-text summary printed at the end of a run."""
    lines = []
    add = lines.append
    for job in ("comm_mpi", "comm_gloo"):
        c = results[job]["controller"]
        variants = [v for v in (f"hvd_{c}", f"hvd_{c}_fp16", "mpi4py", "torch_gloo") if _sweep(results, job, v)]
        add(f"\n(a) allreduce bus bandwidth, GB/s (fraction of memcpy), job launched over {c.upper()}")
        add(f"{'size':>8} " + " ".join(f"{v:>20}" for v in variants) + f" {'memcpy':>9}")
        mem = _sweep(results, job, "memcpy")
        for n in sorted(mem):
            cells = []
            for v in variants:
                r = _sweep(results, job, v)[n]
                cells.append(f"{r['bandwidth_Bps'] / 1e9:8.3f} ({r['fraction_of_memcpy']:5.1%})")
            add(
                f"{_fmt_bytes(n):>8} "
                + " ".join(f"{c_:>20}" for c_ in cells)
                + f" {mem[n]['bandwidth_Bps'] / 1e9:9.2f}"
            )
        plain, fp16 = _sweep(results, job, f"hvd_{c}"), _sweep(results, job, f"hvd_{c}_fp16")
        add(
            "(b) fp16 time / none: "
            + ", ".join(f"{_fmt_bytes(n)} {fp16[n]['median_s'] / plain[n]['median_s']:.2f}" for n in sorted(plain))
        )
        pays = compression_advice(results, job)
        add(
            "    advice: "
            + (
                f"compress gradients of {', '.join(_fmt_bytes(n) for n in pays)}"
                if pays
                else "do not compress (fp16 is not faster at any bandwidth-bound size here)"
            )
        )
        fu = results[job]["fusion"]
        base = fu["variants"]["one_tensor"]["median_s"]
        add(
            f"(c) {fu['tensors']} x {fu['bytes_each'] >> 10} KB tensors, time / one tensor of the same total: "
            + ", ".join(f"{v} {d['median_s'] / base:.1f}x" for v, d in fu["variants"].items())
        )
    for key, title in (("train_torch", "PyTorch"), ("train_keras", "Keras")):
        t = results[key]
        add(f"\n(d) {title} training step, {t['model']}: per rank")
        for v, d in t["variants"].items():
            add(
                f"  {v:>13}: {d['median_s'] * 1e3:8.2f} ms/step ±{d['spread']:.0%}  "
                f"{d['samples_per_s']:9.0f} samples/s  scaling efficiency {d['scaling_efficiency']:.2f}"
            )
        if "comm_share" in t:
            add(f"  communication share of an hvdkit step: {t['comm_share']:.0%}")
    ck = results["checkpoint"]
    add(
        f"\n(f) checkpoint of {ck['payload_bytes'] // MB} MB: "
        + ", ".join(f"{v} {d['median_s'] * 1e3:.0f} ms" for v, d in ck["variants"].items())
    )
    st = results["startup"]
    add("(g) start-up of 2 ranks: " + ", ".join(f"{v} {d['median_s']:.2f} s" for v, d in st["variants"].items()))
    if "zero" in results:
        lines += zero_table(results["zero"], results["ranks"])
    if "tuning" in results:
        add("\nHorovod settings (hvdkit step ms, 4 KB allreduce ms):")
        for label, d in results["tuning"].items():
            add(f"  {label:>30}: {d['step_s']['median_s'] * 1e3:7.2f}  {d['allreduce_4k_s']['median_s'] * 1e3:6.3f}")
    add("\nGoals (ratios from this run):")
    for g in results["goals"]:
        verdict = {True: "met", False: "NOT met", None: ""}[g["met"]]
        add(f"  {g['name']:<48} {g['value']:8.3f}  target {g['target']:<8} {verdict}")
    return "\n".join(lines)


def plots(results: dict[str, Any], out: str) -> list[str]:
    """``PLOTS`` in ``out``: bus bandwidth against size (with the memcpy ceiling), scaling efficiency; their paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5), sharey=True)
    for ax, job in zip(axes, ("comm_mpi", "comm_gloo"), strict=True):
        c = results[job]["controller"]
        for v in (f"hvd_{c}", f"hvd_{c}_fp16", "mpi4py", "torch_gloo", "memcpy"):
            rows = _sweep(results, job, v)
            if rows:
                xs = sorted(rows)
                style = "k--" if v == "memcpy" else "o-"
                label = "memory copy (ceiling)" if v == "memcpy" else v
                ax.plot([x / 1024 for x in xs], [rows[x]["bandwidth_Bps"] / 1e9 for x in xs], style, label=label)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        sizes = sorted(_sweep(results, job, "memcpy"))
        ax.set_xticks([n / 1024 for n in sizes], [_fmt_bytes(n) for n in sizes], fontsize=8)
        ax.set_xlabel("message size (fp32)")
        ax.set_title(f"allreduce, {results['ranks']} ranks, job over {c.upper()}")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    axes[0].set_ylabel("bus bandwidth (GB/s)")
    paths.append(save_figure(fig, os.path.join(out, PLOTS[0])))

    fig, ax = plt.subplots(figsize=(8, 4.5))
    labels, values = [], []
    for key, title in (("train_torch", "torch"), ("train_keras", "keras")):
        for v, d in results[key]["variants"].items():
            if v != "single":
                labels.append(f"{title}\n{v}")
                values.append(d["scaling_efficiency"])
    bars = ax.bar(range(len(values)), values, color=["#999" if "compute_only" in lb else "#3b7" for lb in labels])
    ax.bar_label(bars, fmt="%.2f")
    ax.axhline(1.0, color="k", lw=0.8)
    ax.set_xticks(range(len(values)), labels, fontsize=8)
    ax.set_ylabel(f"scaling efficiency, 1 -> {results['ranks']} ranks")
    ax.set_title("training throughput per rank vs one process (grey: no communication at all)")
    paths.append(save_figure(fig, os.path.join(out, PLOTS[1])))
    if "zero" in results:
        paths.append(zero_plot(results["zero"], os.path.join(out, PLOTS[2])))
    return paths


def markdown(results: dict[str, Any], plots: list[str], docs_dir: str) -> str:
    """The run as Markdown: machine, goals, the table, the plots (linked relative to ``docs_dir``)."""
    m = results["machine"]
    rel = [os.path.relpath(p, docs_dir) for p in plots]
    lines = [
        f"Recorded {m['date']} by `hvdkit bench` in {results['seconds']:.0f} s"
        + (" (--quick: checks only, not figures)" if results["quick"] else "")
        + ".",
        f"Machine: {m['cpu']}, {m['cores']} cores, {(m['memory_bytes'] or 0) / 2**30:.0f} GiB, {m['os']}; "
        f"load average at start {m['load_average_at_start'][0]:.2f}.",
        "Versions: " + ", ".join(f"{k} {v}" for k, v in m["versions"].items()) + ".",
        "",
        "| goal | measured | target | |",
        "|---|---|---|---|",
    ]
    for g in results["goals"]:
        verdict = {True: "met", False: "**not met**", None: ""}[g["met"]]
        lines.append(f"| {g['name']} | {g['value']:.3f} | {g['target']} | {verdict} |")
    lines += [
        "",
        *[f"![{os.path.splitext(os.path.basename(p))[0]}]({p})" for p in rel],
        "",
        "```",
        table(results).strip(),
        "```",
        "",
    ]
    return "\n".join(lines)
