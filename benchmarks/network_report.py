"""The network section's results as ratios, a table, plots and Markdown (results.md, docs/benchmarks.md).

python -m benchmarks.network_report OUT [PAGE]   # re-render OUT/results.json (and PAGE's section)
"""

import os

from hvdkit.bench.report import save_figure
from hvdkit.bench.stats import Samples

from . import docs

__all__ = ["PLOTS", "goals", "render", "tuned_summary", "compression_rows", "table", "plots", "markdown"]

PLOTS = ("network_bandwidth.png", "network_steps.png")  # what plots() draws into the results folder
MB = 1 << 20
COMM_VARIANTS = {
    "comm_mpi": ("hvd_mpi", "hvd_mpi_fp16", "mpi4py", "torch_gloo"),
    "comm_gloo": ("hvd_gloo", "hvd_gloo_fp16", "torch_gloo"),
}
TRAIN_VARIANTS = ("single", "compute_only", "hvdkit", "horovod", "ddp", "hvdkit_fp16")


def _step(result, variant):
    return result["variants"][variant]["median_s"]


def _picked(result):
    """The training variant that matches what ``compression="auto"`` chose in this job (None: no hook)."""
    auto = result.get("auto_compression")
    if not auto:
        return None
    return "hvdkit_fp16" if auto["choice"] == "fp16" else "hvdkit"


def _ratio_samples(a_runs, b_runs, a_variant, b_variant):
    """Samples of step(a) / step(b), pairing the runs of one interleaved repetition.

    ``b_variant`` "auto": in each b run, the variant that run's ``compression="auto"`` picked.
    """
    return Samples(
        _step(a, a_variant) / _step(b, _picked(b) if b_variant == "auto" else b_variant)
        for a, b in zip(a_runs, b_runs, strict=True)
    )


def tuned_summary(runs):
    """hvdkit's settings against Horovod's defaults: throughput ratios (> 1: hvdkit faster) and spreads.

    ``engine_settings``: the same fp32 step under each set of engine settings. ``with_auto``: hvdkit's
    settings and the compression ``"auto"`` picked in that job, against Horovod's defaults in fp32.
    ``fp16_gain``: fp32 step / fp16 step, both under hvdkit's settings.
    """
    default, tuned = runs["horovod defaults"], runs["hvdkit defaults"]
    engine = _ratio_samples(default, tuned, "hvdkit", "hvdkit")
    # The same ratio with each step divided by the single-process step of its own job: what the
    # machine's load did to that job cancels (both are timed interleaved in one job).
    per_single = Samples(
        (_step(a, "hvdkit") / _step(a, "single")) / (_step(b, "hvdkit") / _step(b, "single"))
        for a, b in zip(default, tuned, strict=True)
    )
    out = {
        "default_step_s": Samples(_step(r, "hvdkit") for r in default).median,
        "tuned_step_s": Samples(_step(r, "hvdkit") for r in tuned).median,
        "engine_settings": {"ratio": engine.median, "spread": engine.spread, "samples": engine.values},
        "engine_settings_per_single": {
            "ratio": per_single.median,
            "spread": per_single.spread,
            "samples": per_single.values,
        },
        "auto_choices": [(r.get("auto_compression") or {}).get("choice") for r in tuned],
    }
    if "hvdkit_fp16" in tuned[0]["variants"]:
        gain = Samples(_step(r, "hvdkit") / _step(r, "hvdkit_fp16") for r in tuned)
        out["fp16_gain"] = {"ratio": gain.median, "spread": gain.spread, "samples": gain.values}
    if all(_picked(r) for r in tuned):
        auto = _ratio_samples(default, tuned, "hvdkit", "auto")
        out["with_auto"] = {"ratio": auto.median, "spread": auto.spread, "samples": auto.values}
    return out


def goals(results):
    """The issue's goals as ratios measured in this run: [{name, value, target, met}]."""
    rows = []
    lat = results["latency"]
    for place in [p for p in lat if p != "settings"]:
        mine, theirs = lat[place].get("hvdkit defaults"), lat[place].get("horovod defaults")
        if not (mine and theirs):
            continue
        if place.startswith("one_host"):
            ms = mine["allreduce_4k_s"] * 1e3
            rows.append((f"4 KB allreduce with hvdkit's settings, {place} (ms)", ms, "<= 0.3", ms <= 0.3))
        r = theirs["step_s"] / mine["step_s"]
        rows.append((f"step throughput hvdkit / Horovod settings, {place}", r, ">= 0.99", r >= 0.99))
    s = results["tuned"]["summary"]
    link = results["tuned"]["link"]
    rows.append(
        (
            f"step throughput hvdkit / Horovod settings at {link}, fp32",
            s["engine_settings"]["ratio"],
            ">= 1.15",
            s["engine_settings"]["ratio"] >= 1.15,
        )
    )
    if "engine_settings_per_single" in s:
        r = s["engine_settings_per_single"]["ratio"]
        rows.append(("... each step over its own job's single-process step", r, ">= 1.15", r >= 1.15))
    if "with_auto" in s:
        rows.append(
            (
                f"... with compression='auto' at {link}",
                s["with_auto"]["ratio"],
                ">= 1.15",
                s["with_auto"]["ratio"] >= 1.15,
            )
        )
    for row in compression_rows(results):
        if "picked_faster" in row:
            rows.append(
                (
                    f"compression='auto' picks the faster step at {row['link']}",
                    float(row["picked_faster"]),
                    "== 1",
                    row["picked_faster"],
                )
            )
    return [{"name": n, "value": v, "target": t, "met": m} for n, v, t, m in rows]


def compression_rows(results):
    """Per link: what ``auto`` picked, its two allreduce times, the fp32/fp16 steps, and whether it
    picked the faster step (or fp32 within its margin)."""
    rows = []
    for link, d in results["links"].items():
        t = d["train"]
        auto = t.get("auto_compression")
        fp32, fp16 = _step(t, "hvdkit"), _step(t, "hvdkit_fp16")
        row = {"link": link, "fp32_step_s": fp32, "fp16_step_s": fp16, "fp16_gain": fp32 / fp16, "auto": auto}
        if auto:
            faster = "fp16" if fp16 < fp32 else "none"
            within_margin = abs(fp32 / fp16 - 1) <= auto["margin"]
            row["picked_faster"] = auto["choice"] == faster or (auto["choice"] == "none" and within_margin)
        rows.append(row)
    return rows


def _gbit(bps):
    return bps * 8 / 1e9


def _fmt(n):
    return f"{n // MB} MB" if n >= MB else f"{n >> 10} KB"


def _sweep(job, variant):
    return {r["bytes"]: r for r in job["sweep"] if r["variant"] == variant}


def _ceiling(d):
    """(shaped rate, raw TCP) in bits/s: the two ceilings every bandwidth is divided by."""
    return d["rate_bits_per_s"], d["tcp"]["median_bits_per_s"]


def table(results):
    """The plain-text summary printed at the end of a run."""
    lines = []
    add = lines.append
    for link, d in results["links"].items():
        rate, tcp = _ceiling(d)
        add(
            f"\nlink {link}: raw TCP stream {tcp / 1e9:.2f} Gbit/s (spread {d['tcp']['spread']:.0%})"
            + (f" = {tcp / rate:.0%} of the shaped rate" if rate else "")
        )
        for job, variants in COMM_VARIANTS.items():
            add(
                f"  allreduce bus bandwidth, Gbit/s (fraction of {'shaped rate' if rate else 'raw TCP'}), "
                f"job over {job[5:].upper()}:"
            )
            add(f"  {'size':>8} " + " ".join(f"{v:>22}" for v in variants))
            for n in sorted(_sweep(d[job], variants[0])):
                cells = []
                for v in variants:
                    r = _sweep(d[job], v)[n]
                    bits = r["bandwidth_Bps"] * 8
                    cells.append(f"{bits / 1e9:7.3f} ({bits / (rate or tcp):6.1%}) ±{r['spread']:.0%}")
                add(f"  {_fmt(n):>8} " + " ".join(f"{c:>22}" for c in cells))
        t = d["train"]
        add(f"  training step, {t['model']}:")
        for v, r in t["variants"].items():
            add(
                f"    {v:>13}: {r['median_s'] * 1e3:8.2f} ms/step ±{r['spread']:.0%}  "
                f"{r['samples_per_s']:8.0f} samples/s"
                f"  scaling efficiency {r['scaling_efficiency']:.2f}"
            )
    add("\ncompression='auto' at each link (allreduce of the model's gradients; training steps):")
    for row in compression_rows(results):
        auto = row["auto"]
        pick = (
            (
                f"auto -> {auto['choice']!r} (fp32 {auto['fp32_s'] * 1e3:.1f} ms, fp16 {auto['fp16_s'] * 1e3:.1f} ms); "
                f"picked the faster: {row['picked_faster']}"
            )
            if auto
            else "auto: no hvdkit.torch.autocompress here (hook empty)"
        )
        add(
            f"  {row['link']:>10}: fp32 step {row['fp32_step_s'] * 1e3:.1f} ms, fp16 {row['fp16_step_s'] * 1e3:.1f} ms "
            f"(fp16 gain {row['fp16_gain']:.2f}x); {pick}"
        )
    lat = results["latency"]
    places = [p for p in lat if p != "settings"]
    add("\nHorovod settings: hvdkit step ms ±spread / 4 KB allreduce ms / idle CPU (cores), " + " | ".join(places))
    for label in lat["settings"]:
        cells = [
            f"{lat[p][label]['step_s'] * 1e3:8.2f} ±{lat[p][label]['step_spread']:.0%} / "
            f"{lat[p][label]['allreduce_4k_s'] * 1e3:6.3f} / {lat[p][label].get('idle_cpu', float('nan')):4.2f}"
            if label in lat[p]
            else f"{'-':>30}"
            for p in places
        ]
        add(f"  {label:>20}: " + " | ".join(cells))
    add("\nGoals (ratios from this run):")
    for g in goals(results):
        add(f"  {g['name']:<62} {g['value']:8.3f}  target {g['target']:<8} {'met' if g['met'] else 'NOT met'}")
    s = results["tuned"]["summary"]
    add(
        f"\nhvdkit settings vs Horovod defaults at {results['tuned']['link']} "
        "(step throughput ratio, > 1: hvdkit faster):"
    )
    add(
        f"  engine settings only: {s['engine_settings']['ratio']:.3f} (spread {s['engine_settings']['spread']:.0%}); "
        f"each step divided by its own job's single-process step: {s['engine_settings_per_single']['ratio']:.3f} "
        f"(spread {s['engine_settings_per_single']['spread']:.0%})"
    )
    if "with_auto" in s:
        add(
            f"  with compression='auto' ({', '.join(map(str, s['auto_choices']))}): "
            f"{s['with_auto']['ratio']:.3f} (spread {s['with_auto']['spread']:.0%})"
        )
    if "fp16_gain" in s:
        add(
            f"  fp16 / fp32 step throughput under hvdkit's settings: {s['fp16_gain']['ratio']:.3f} "
            f"(spread {s['fp16_gain']['spread']:.0%})"
        )
    return "\n".join(lines)


def plots(results, out):
    """``PLOTS`` in ``out``: bus bandwidth per link, training steps and latency per setting; their paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    links = list(results["links"])
    fig, axes = plt.subplots(1, len(links), figsize=(5.5 * len(links), 4.5), squeeze=False)
    for ax, link in zip(axes[0], links, strict=True):
        d = results["links"][link]
        rate, tcp = _ceiling(d)
        for job, variants in COMM_VARIANTS.items():
            for v in variants:
                if job == "comm_gloo" and v == "torch_gloo":
                    continue  # the same transport as in the MPI job
                rows = _sweep(d[job], v)
                xs = sorted(rows)
                ax.plot([x / 1024 for x in xs], [rows[x]["bandwidth_Bps"] * 8 / 1e9 for x in xs], "o-", ms=3, label=v)
        if rate:
            ax.axhline(rate / 1e9, color="k", ls="--", lw=1, label="shaped rate")
        ax.axhline(tcp / 1e9, color="grey", ls=":", lw=1.5, label="raw TCP stream")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        sizes = sorted(_sweep(d["comm_mpi"], "hvd_mpi"))
        ax.set_xticks([n / 1024 for n in sizes], [_fmt(n) for n in sizes], fontsize=8)
        ax.set_xlabel("allreduce size (fp32)")
        ax.set_title(f"2 hosts, link {link}")
        ax.grid(True, which="both", alpha=0.3)
    axes[0][0].set_ylabel("bus bandwidth (Gbit/s; fp16: of the fp32 size)")
    axes[0][-1].legend(fontsize=7)
    paths.append(save_figure(fig, os.path.join(out, PLOTS[0]), dpi=100))

    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
    variants = [v for v in TRAIN_VARIANTS if v in results["links"][links[0]]["train"]["variants"]]
    width = 0.8 / len(variants)
    for j, v in enumerate(variants):
        ys = [results["links"][lk]["train"]["variants"][v]["samples_per_s"] for lk in links]
        ax.bar([i + j * width for i in range(len(links))], ys, width, label=v)
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(links))], links)
    ax.set_ylabel("samples/s (all ranks)")
    ax.set_title("training step across 2 hosts")
    ax.legend(fontsize=7)
    lat = results["latency"]
    places = [p for p in lat if p != "settings"]
    labels = list(lat["settings"])
    for j, p in enumerate(places):
        w = 0.8 / len(places)
        ax2.bar(
            [i + j * w for i, lb in enumerate(labels) if lb in lat[p]],
            [lat[p][lb]["allreduce_4k_s"] * 1e3 for lb in labels if lb in lat[p]],
            w,
            label=p,
        )
    ax2.set_xticks(
        [i + 0.4 - 0.4 / len(places) for i in range(len(labels))], labels, rotation=30, ha="right", fontsize=7
    )
    ax2.set_yscale("log")
    ax2.set_ylabel("4 KB allreduce (ms)")
    ax2.set_title("Horovod settings: small-message latency")
    ax2.legend(fontsize=7)
    paths.append(save_figure(fig, os.path.join(out, PLOTS[1]), dpi=100))
    return paths


def markdown(results, plots, docs_dir):
    """The network results section: machine, headline ratios, plots, the full table."""
    m = results["machine"]
    rel = [os.path.relpath(p, docs_dir) for p in plots]
    s = results["tuned"]["summary"]
    lines = [
        f"Recorded {m['date']} by `python -m benchmarks network` in {results['seconds']:.0f} s"
        + (" (--quick: checks only, not figures)" if results["quick"] else "")
        + ".",
        f"Machine: {m['cpu']}, {m['cores']} cores shared by both hosts; load average at start "
        f"{m['load_average_at_start'][0]:.2f}.",
        "",
        "| link | raw TCP | Horovod MPI bus bw at the largest size, of rate / of TCP | Horovod Gloo | hvdkit step "
        "| fp16 gain | auto picks |",
        "|---|---|---|---|---|---|---|",
    ]
    comp = {r["link"]: r for r in compression_rows(results)}
    for link, d in results["links"].items():
        rate, tcp = _ceiling(d)
        cells = []
        for job, v in (("comm_mpi", "hvd_mpi"), ("comm_gloo", "hvd_gloo")):
            rows = _sweep(d[job], v)
            bits = rows[max(rows)]["bandwidth_Bps"] * 8
            cells.append((f"{bits / rate:.0%}" if rate else "-") + f" / {bits / tcp:.0%}")
        c = comp[link]
        auto = c["auto"]["choice"] if c["auto"] else "(no hook)"
        lines.append(
            f"| {link} | {tcp / 1e9:.2f} Gbit/s | {cells[0]} | {cells[1]} | "
            f"{c['fp32_step_s'] * 1e3:.1f} ms | {c['fp16_gain']:.2f}x | {auto} |"
        )
    lines += ["", "| goal | measured | target | |", "|---|---|---|---|"]
    lines += [
        f"| {g['name']} | {g['value']:.3f} | {g['target']} | {'met' if g['met'] else '**not met**'} |"
        for g in goals(results)
    ]
    lines += [
        "",
        f"hvdkit's settings / Horovod's defaults at {results['tuned']['link']}, step throughput: "
        f"engine settings {s['engine_settings']['ratio']:.3f} (spread {s['engine_settings']['spread']:.0%})"
        + (
            f', with `compression="auto"` {s["with_auto"]["ratio"]:.3f} (spread {s["with_auto"]["spread"]:.0%})'
            if "with_auto" in s
            else ""
        )
        + " (goal >= 1.15).",
        "",
    ]
    lines += [
        *[f"![{os.path.splitext(os.path.basename(p))[0]}]({p})" for p in rel],
        "",
        "```",
        table(results).strip(),
        "```",
        "",
    ]
    return "\n".join(lines)


def render(out, page=None):
    """Rewrite the summary of ``out``/results.json (ratios, table, plots, results.md, ``page``'s section)."""
    import json

    path = os.path.join(out, "results.json")
    with open(path, encoding="utf-8") as f:
        results = json.load(f)
    results["tuned"]["summary"] = tuned_summary(results["tuned"]["runs"])
    results["goals"] = goals(results)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(results, f, indent=1)
    drawn = plots(results, out)
    with open(os.path.join(out, "results.md"), "w", encoding="utf-8") as f:
        f.write(markdown(results, drawn, docs_dir=out))
    if page:
        docs.write_results(page, docs.NETWORK, markdown, results, drawn)
    return results


if __name__ == "__main__":  # python -m benchmarks.network_report OUT [PAGE]: re-render from the JSON
    import sys

    print(table(render(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else None)))
