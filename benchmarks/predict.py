"""``python -m benchmarks predict``: the scaling model (``benchmarks.model``) checked, calibrated, and extrapolated.

    python -m benchmarks predict [--results docs/bench/results.json] [--network docs/bench/network/results.json]
                                 [--out docs/bench] [--docs docs/benchmarks.md]

``make bench-predict`` runs it; it starts no job.

Three parts, written to OUT/prediction.json, OUT/prediction.png and (with ``--docs``) the
``bench:model`` section of the Markdown file:

1. **Published check.** Horovod's own efficiencies (Inception V3, ResNet-101, VGG-16 on 128 and 512
   Pascal GPUs over 25 Gbit/s RoCE) predicted from model sizes, step times and the link rate only.
2. **This machine.** The link fitted to the suite's allreduce sweep, the step to its single-process
   time and ``compute_only`` ratio: predicted against measured efficiency of the torch adapter
   (overlap) and the Keras adapter (no overlap); and, when the network section's JSON exists, the
   link fitted at each shaped rate.
3. **Prediction.** Efficiency at 2-512 ranks on 1/10/25/100 Gbit/s links for the benchmark model and
   for ResNet-50-sized gradients.
4. **ZeRO-1** (``zero_prediction``, when a ZeRO section was recorded: the suite's ``zero`` or
   ``--zero``): memory per rank and step time / efficiency at 8-512 ranks, sharded against not, for
   the section's model from its measured compute and Adam times; memory for a 1.5 B-parameter model
   too. Also drawn to OUT/zero-prediction.png.
"""

import argparse
import glob
import json
import os
import sys

from hvdkit.bench.report import save_figure
from hvdkit.core.errors import ConfigError

from . import docs
from .model import Link, Step, fit_link, simulate
from .zero_predict import zero_plot, zero_prediction, zero_table

__all__ = [
    "PUBLISHED",
    "HOROVOD_2018",
    "published_check",
    "local_check",
    "network_check",
    "network_links",
    "prediction",
    "main",
]

# Horovod's published scaling efficiencies (synthetic ImageNet data, tf_cnn_benchmarks, batch 64 per
# GPU, 4 Pascal GPUs per server, RoCE-capable 25 Gbit/s network):
# - 512 GPUs: Horovod's docs/benchmarks.rst and README (v0.28.1): 90 % Inception V3 and ResNet-101, 68 % VGG-16.
# - 128 GPUs: Horovod's README of early 2018 (32 servers) and the paper's benchmark
#   (Sergeev & Del Balso, "Horovod: fast and easy distributed deep learning in TensorFlow",
#   arXiv:1802.05799): 90 % Inception V3 and ResNet-101, 79 % VGG-16.
# Model sizes are the architectures' parameter counts; ``head`` is the share of the parameters
# whose gradients exist at the start of the backward pass (the classifier layers, computed first
# and cheaply: VGG-16's three fully connected layers hold 123.6 M of its 138.4 M).
# Step times are NOT published by Horovod: one Pascal P100's throughput at batch 64 of that period
# is assumed (about 140 / 130 / 150 images/s for Inception V3 / ResNet-101 / VGG-16).
PUBLISHED = (
    # (model, GPUs, published efficiency, parameters, images/s on one GPU, head)
    ("Inception V3", 128, 0.90, 23.8e6, 140.0, 0.086),
    ("ResNet-101", 128, 0.90, 44.5e6, 130.0, 0.046),
    ("VGG-16", 128, 0.79, 138.4e6, 150.0, 0.893),
    ("Inception V3", 512, 0.90, 23.8e6, 140.0, 0.086),
    ("ResNet-101", 512, 0.90, 44.5e6, 130.0, 0.046),
    ("VGG-16", 512, 0.68, 138.4e6, 150.0, 0.893),
)
BATCH = 64
# What the check assumes beyond the published figures: Horovod's defaults of 2018 (fusion 64 MB,
# cycle 5 ms), the full 25 Gbit/s per GPU's ring link, 10 us per ring hop, and 7 % lost by four GPUs
# sharing a server without communicating (the counterpart of the suite's compute_only ratio). The
# last two were picked within plausible ranges by a small grid search over these six points; the
# bandwidth is the published link rate.
HOROVOD_2018 = {"fusion_bytes": 64 * 2**20, "cycle_s": 5e-3, "share": 0.93, "rate_gbit": 25.0, "alpha_s": 10e-6}

RATES_GBIT = (1, 10, 25, 100)
RANKS = (2, 4, 8, 16, 32, 64, 128, 256, 512)
DEFAULT_ALPHA_S = 10e-6  # per ring hop on a datacenter network, when no measurement gives one
RESNET50 = {
    "name": "ResNet-50-sized (25.6 M parameters, 0.25 s compute)",
    "parameters": 25.6e6,
    "compute_s": 0.25,
    "head": 0.08,
}


def published_check(assume=HOROVOD_2018):
    """Rows ``{model, gpus, published, predicted, diff_points, ...}`` for Horovod's published efficiencies."""
    link = Link.gbit(assume["rate_gbit"], assume["alpha_s"])
    rows = []
    for model, gpus, published, params, images_per_s, head in PUBLISHED:
        step = Step(
            params * 4,
            BATCH / images_per_s,
            head=head,
            fusion_bytes=assume["fusion_bytes"],
            cycle_s=assume["cycle_s"],
            share=assume["share"],
        )
        sim = simulate(step, gpus, link)
        rows.append(
            {
                "model": model,
                "gpus": gpus,
                "published": published,
                "predicted": sim["efficiency"],
                "diff_points": 100 * (sim["efficiency"] - published),
                "grad_MB": params * 4 / 1e6,
                "step_s": step.compute_s,
                "messages": sim["messages"],
                "comm_s": sim["comm_s"],
            }
        )
    return rows


def _sweep_points(comm, min_bytes=1 << 20):
    """(bytes, seconds) of the plain Horovod allreduce in a ``comm_bench`` result, from ``min_bytes`` up."""
    c = comm["controller"]
    return [
        (r["bytes"], r["median_s"])
        for r in comm["sweep"]
        if r.get("variant") == f"hvd_{c}" and r["bytes"] >= min_bytes and "median_s" in r
    ]


def local_check(results):
    """The model calibrated on the suite's JSON (docs/bench/results.json) against its measured efficiencies.

    None when the MPI sweep has no two sizes of 1 MB or more to fit a link to (a ``--quick`` run).
    """
    p = results["ranks"]
    try:
        link = fit_link(_sweep_points(results["comm_mpi"]), p)
    except ValueError:
        return None
    out = {"link": {"bytes_per_s": link.bytes_per_s, "alpha_s": link.alpha_s, "fitted_on": "comm_mpi sweep, >= 1 MB"}}
    for key, overlap in (("train_torch", True), ("train_keras", False)):
        train = results[key]
        v = train["variants"]
        params = train["model"].get("parameters") or results["train_torch"]["model"]["parameters"]
        share = v["compute_only"]["scaling_efficiency"]
        step = Step(params * 4, v["single"]["median_s"], overlap=overlap, share=share)
        sim = simulate(step, p, link)
        out[key] = {
            "overlap": overlap,
            "share_compute_only": share,
            "predicted": sim["efficiency"],
            "predicted_without_overlap": simulate(step.with_(overlap=False), p, link)["efficiency"],
            "measured": v["hvdkit"]["scaling_efficiency"],
            "diff_points": 100 * (sim["efficiency"] - v["hvdkit"]["scaling_efficiency"]),
            "comm_s": sim["comm_s"],
            "exposed_s": sim["exposed_s"],
        }
    return out


def network_links(network):
    """``{rate tag: Link}`` fitted to the network section's MPI sweep at each shaped rate (empty without it)."""
    links = {}
    for tag, r in (network or {}).get("links", {}).items():
        try:
            points = _sweep_points(r["comm_mpi"], 64 << 10)
            links[tag] = fit_link(points, network.get("ranks", 2))
        except (KeyError, ValueError, ZeroDivisionError):
            continue
    return links


def network_check(network, links):
    """Per shaped rate: the fitted link's predicted 2-rank efficiency of the benchmark step against the measured one."""
    rows = {}
    for tag, link in links.items():
        try:
            train = network["links"][tag]["train"]
            v = train["variants"]
            step = Step(
                train["model"]["parameters"] * 4, v["single"]["median_s"], share=v["compute_only"]["scaling_efficiency"]
            )
            rows[tag] = {
                "bytes_per_s": link.bytes_per_s,
                "alpha_s": link.alpha_s,
                "predicted": simulate(step, network.get("ranks", 2), link)["efficiency"],
                "predicted_without_overlap": simulate(step.with_(overlap=False), network.get("ranks", 2), link)[
                    "efficiency"
                ],
                "measured": v["hvdkit"]["scaling_efficiency"],
            }
        except (KeyError, TypeError, ValueError):
            continue
    return rows


def _workloads(results):
    bench = results["train_torch"]
    return {
        "benchmark MLP": {
            "name": f"benchmark MLP ({bench['model']['parameters'] / 1e6:.1f} M parameters, "
            f"{bench['variants']['single']['median_s'] * 1e3:.0f} ms compute)",
            "parameters": bench["model"]["parameters"],
            "compute_s": bench["variants"]["single"]["median_s"],
            "head": 0.0,
        },
        "ResNet-50": RESNET50,
    }


def prediction(results, alpha_s=DEFAULT_ALPHA_S, rates=RATES_GBIT, ranks=RANKS):
    """``{workload: {"name", "rates"/"fp16_rates": {gbit: {p: efficiency}}}}``: Horovod 0.28 defaults,
    overlap on, one rank per host.

    ``fp16_rates``: the same with half the bytes on the wire (``compression="fp16"``), the casts' cost left out.
    """
    out = {}
    for key, w in _workloads(results).items():
        step = Step(w["parameters"] * 4, w["compute_s"], head=w["head"])
        half = step.with_(grad_bytes=step.grad_bytes / 2)  # fp16 on the wire; the casts' cost left out
        out[key] = {
            "name": w["name"],
            "alpha_s": alpha_s,
            "rates": {
                str(g): {str(p): simulate(step, p, Link.gbit(g, alpha_s))["efficiency"] for p in ranks} for g in rates
            },
            "fp16_rates": {
                str(g): {str(p): simulate(half, p, Link.gbit(g, alpha_s))["efficiency"] for p in ranks} for g in rates
            },
        }
    return out


def table(report):
    lines = [
        "Published check (Horovod, 25 Gbit/s RoCE; model: sizes, step times, link rate):",
        "    model          GPUs  published  predicted  diff (points)",
    ]
    for r in report["published"]:
        lines.append(
            f"    {r['model']:<13} {r['gpus']:5d}  {r['published']:9.2f}  {r['predicted']:9.3f}  "
            f"{r['diff_points']:+6.1f}"
        )
    loc = report.get("local")
    if not loc:
        lines.append("This machine: not calibrated (the suite's MPI sweep has no two sizes >= 1 MB; --quick runs none)")
    else:
        lk = loc["link"]
        lines.append(
            f"This machine: link fitted {lk['bytes_per_s'] / 1e9:.2f} GB/s, alpha {lk['alpha_s'] * 1e6:.0f} us per hop"
        )
        for key in ("train_torch", "train_keras"):
            d = loc[key]
            lines.append(
                f"    {key:<12} overlap={str(d['overlap']):<5} predicted {d['predicted']:.3f} "
                f"(without overlap {d['predicted_without_overlap']:.3f})  measured {d['measured']:.3f}"
                f"  ({d['diff_points']:+.1f} points; compute_only {d['share_compute_only']:.2f})"
            )
    for tag, d in report.get("network", {}).items():
        lines.append(
            f"Shaped link {tag}: fitted {d['bytes_per_s'] / 1e9:.3f} GB/s, alpha {d['alpha_s'] * 1e6:.0f} us; "
            f"2 ranks predicted {d['predicted']:.3f} (without overlap {d['predicted_without_overlap']:.3f}), "
            f"measured {d['measured']:.3f}"
        )
    for w in report["prediction"].values():
        lines.append(f"Predicted efficiency, {w['name']}, alpha {w['alpha_s'] * 1e6:.0f} us:")
        ranks = list(next(iter(w["rates"].values())))
        lines.append(f"    {'Gbit/s':>7} " + "".join(f"{p:>7}" for p in ranks))
        for g, row in w["rates"].items():
            lines.append(f"    {g:>7} " + "".join(f"{row[p]:7.2f}" for p in ranks))
        for g in ("1", "10"):
            row = w["fp16_rates"].get(g)
            if row:
                lines.append(f"    {g + ' fp16':>7} " + "".join(f"{row[p]:7.2f}" for p in ranks))
    if report.get("zero"):
        lines += zero_table(report["zero"])
    return "\n".join(lines)


def plot(report, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(report["prediction"]), figsize=(12, 4.5), sharey=True)
    for ax, w in zip(axes, report["prediction"].values(), strict=True):
        for g, row in w["rates"].items():
            ps = [int(p) for p in row]
            ax.plot(ps, list(row.values()), "o-", label=f"{g} Gbit/s")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("ranks (one per host)")
        ax.set_title(w["name"], fontsize=9)
        ax.grid(True, which="both", alpha=0.3)
        ax.set_ylim(0, 1.05)
        ax.legend(fontsize=8)
    axes[0].set_ylabel("predicted scaling efficiency")
    fig.suptitle("alpha-beta model: ring allreduce, Horovod 0.28 fusion/cycle, overlap with backward", fontsize=10)
    return save_figure(fig, path)


def build_report(results, network=None, zero=None):
    """Every part of the report; ``zero``: a recorded ZeRO-1 section (default: the suite's own, if any)."""
    links = network_links(network)
    alpha = DEFAULT_ALPHA_S
    report = {
        "published": published_check(),
        "assumptions": dict(HOROVOD_2018),
        "local": local_check(results),
        "network": network_check(network, links),
    }
    report["prediction"] = prediction(results, alpha)
    zero = zero or results.get("zero")
    report["zero"] = zero_prediction(zero, alpha) if zero else None
    return report


def _load(path):
    if path and os.path.isfile(path):
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    return None


def _first_file(*paths):
    """The first of ``paths`` that is a file, else the last (for the message that it is missing)."""
    return next((p for p in paths if os.path.isfile(p)), paths[-1])


def main(argv=None):
    """``python -m benchmarks predict``; the exit code."""
    p = argparse.ArgumentParser(
        prog="python -m benchmarks predict",
        description="The scaling model checked against Horovod's published efficiencies, calibrated on the suite's "
        "results, predicted at 2-512 ranks; no jobs (make bench-predict).",
    )
    p.add_argument(
        "--out", default="docs/bench", help="folder for prediction.json and prediction.png (default: docs/bench)"
    )
    p.add_argument(
        "--results",
        default=None,
        help="the suite's JSON, for calibration (default: OUT/results.json if it exists, else docs/bench/results.json)",
    )
    p.add_argument(
        "--network",
        default=None,
        help="the network section's JSON, if any "
        "(default: OUT/network/results.json if it exists, else docs/bench/network/results.json)",
    )
    p.add_argument(
        "--zero",
        default=None,
        help="a recorded ZeRO-1 section's JSON (default: the suite's own, else the newest docs/bench/zero-*/zero.json)",
    )
    p.add_argument("--docs", default=None, metavar="PAGE", help="also rewrite the bench:model section of this page")
    args = p.parse_args(argv)
    results_path = args.results or _first_file(os.path.join(args.out, "results.json"), "docs/bench/results.json")
    network_path = args.network or _first_file(
        os.path.join(args.out, "network", "results.json"), "docs/bench/network/results.json"
    )
    results = _load(results_path)
    if results is None:
        raise ConfigError(f"no suite results at {results_path}; run `hvdkit bench --out {args.out}` first")
    if args.docs:
        docs.check_page(args.docs, docs.MODEL)
    recorded = sorted(glob.glob("docs/bench/zero-*/zero.json"))
    zero_path = args.zero or (recorded[-1] if recorded and "zero" not in results else None)
    if args.zero and not os.path.isfile(args.zero):
        raise ConfigError(
            f"--zero {args.zero!r} is not a file; pass a ZeRO-1 section's JSON (docs/bench/zero-*/zero.json)"
        )
    report = build_report(results, _load(network_path), _load(zero_path))
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "prediction.json"), "w", encoding="utf-8") as f:
        json.dump(report, f, indent=1)
    text = table(report)
    print(text)
    png = plot(report, os.path.join(args.out, "prediction.png"))
    if report["zero"]:
        zero_plot(report["zero"], os.path.join(args.out, "zero-prediction.png"))
    if args.docs:
        rel = os.path.relpath(png, os.path.dirname(args.docs) or ".")
        docs.replace_section(args.docs, f"![prediction]({rel})\n\n```\n{text}\n```\n", docs.MODEL)
    return 0


if __name__ == "__main__":
    sys.exit(main())
