"""ZeRO-1 in the scaling model: memory per rank and step time at 8-512 ranks, sharded against not.

Called by ``python -m benchmarks predict`` (``benchmarks.predict``) with a recorded ``(h)`` section
of ``hvdkit bench`` (docs/bench/zero-*/zero.json, or the suite's own ``zero``).
"""

from hvdkit.bench.report import save_figure

from .model import Link, Step, zero_memory, zero_step

__all__ = ["ZERO_RANKS", "ZERO_RATES_GBIT", "zero_prediction", "zero_table", "zero_plot"]

DEFAULT_ALPHA_S = 10e-6  # per ring hop on a datacenter network (as benchmarks.predict)

ZERO_RANKS = (8, 16, 32, 64, 128, 256, 512)
ZERO_RATES_GBIT = (10, 25, 100)
ZERO_LARGE_PARAMS = 1.5e9  # a GPT-2-XL-sized model: what ZeRO-1 is for
# hvdkit's ShardedOptimizer besides the state slice (per parameter of the slice), and during a step
# (per parameter). Until 2026-11-26 a copy of the slice and its gradient (8), and the flat gradient,
# then the gathered parameters (4); since its flat buffers (docs/bench/zero-2026-11-26b) nothing:
# the parameters and gradients are views of them and a step's temporaries are one round of a
# collective (a fixed size, not per parameter; Adam's own temporaries are not counted, as plain's).
HVDKIT_SHARD_COPY_BYTES, HVDKIT_TRANSIENT_BYTES = 0, 0


def zero_prediction(zero, alpha_s=DEFAULT_ALPHA_S, rates=ZERO_RATES_GBIT, ranks=ZERO_RANKS):
    """The ZeRO-1 section's model at ``ranks``: memory per rank and step time / efficiency per link rate.

    ``zero`` is a recorded ``(h)`` section (``hvdkit bench``'s ``zero``): its parameter count and
    one process's forward+backward and Adam times (measured with every rank of the job busy).
    One rank per host; Horovod 0.28's fusion and cycle time.
    """
    t = zero["time"]
    params = t["model"]["parameters"]
    co = t["compute_only"]
    step = Step(params * 4, co["forward_backward_s"])
    comm = t.get("comm_only")
    factor = (
        comm["reducescatter_allgather"]["median_s"] / comm["allreduce"]["median_s"] if comm else 1.0
    )  # this engine's reduce-scatter + all-gather against its allreduce of the same bytes

    def memory(n):
        rows = {}
        for p in ranks:
            ideal = zero_memory(n, p)
            hvdkit = zero_memory(n, p, shard_copy_bytes=HVDKIT_SHARD_COPY_BYTES, transient_bytes=HVDKIT_TRANSIENT_BYTES)
            rows[str(p)] = {"plain": ideal["plain"], "sharded": ideal["sharded"], "hvdkit_peak": hvdkit["sharded"]}
        return rows

    return {
        "parameters": params,
        "forward_backward_s": co["forward_backward_s"],
        "adam_step_s": co["adam_step_s"],
        "alpha_s": alpha_s,
        "comm_factor": factor,
        "memory_bytes": memory(params),
        "memory_bytes_large": memory(ZERO_LARGE_PARAMS),
        "large_parameters": ZERO_LARGE_PARAMS,
        "rates": {
            str(g): {str(p): zero_step(step, co["adam_step_s"], p, Link.gbit(g, alpha_s)) for p in ranks} for g in rates
        },
        "rates_measured_factor": {
            str(g): {
                str(p): zero_step(step, co["adam_step_s"], p, Link.gbit(g, alpha_s), factor)["sharded"] for p in ranks
            }
            for g in rates
        },
    }


def zero_table(z):
    """The ZeRO-1 prediction as text lines."""
    ranks = list(z["memory_bytes"])
    lines = [
        "ZeRO-1 (Adam, fp32) per rank: memory (MB, GB: 2**20, 2**30 bytes) and step time (ms), plain vs sharded;",
        f"  'x{z['comm_factor']:.2f}': reduce-scatter + all-gather cost that many allreduces of the same bytes "
        "(measured), not the ring's 1.",
        f"  Section's model {z['parameters'] / 1e6:.1f} M parameters, forward+backward "
        f"{z['forward_backward_s'] * 1e3:.0f} ms, Adam update {z['adam_step_s'] * 1e3:.0f} ms, alpha "
        f"{z['alpha_s'] * 1e6:.0f} us:",
        f"    {'ranks':>26} " + "".join(f"{p:>8}" for p in ranks),
    ]
    for key, label in (("memory_bytes", "model"), ("memory_bytes_large", f"{z['large_parameters'] / 1e9:.1f} B")):
        rows = z[key]
        unit, scale = ("MB", 2**20) if key == "memory_bytes" else ("GB", 2**30)
        for kind in ("plain", "sharded", "hvdkit_peak"):
            lines.append(
                f"    {label + ' ' + unit + ' ' + kind:>26} " + "".join(f"{rows[p][kind] / scale:8.1f}" for p in ranks)
            )
    for g, row in z["rates"].items():
        measured = z["rates_measured_factor"][g]
        cells = (
            ("plain", [row[p]["plain"]["step_s"] for p in ranks]),
            ("sharded", [row[p]["sharded"]["step_s"] for p in ranks]),
            (f"sharded x{z['comm_factor']:.2f}", [measured[p]["step_s"] for p in ranks]),
        )
        for kind, values in cells:
            lines.append(f"    {f'{g} Gbit/s ms {kind}':>26} " + "".join(f"{v * 1e3:8.0f}" for v in values))
    return lines


def zero_plot(z, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ranks = [int(p) for p in z["memory_bytes"]]
    fig, (mem, eff) = plt.subplots(1, 2, figsize=(12, 4.5))
    rows = z["memory_bytes_large"]
    for kind, style in (("plain", "k-o"), ("sharded", "g-o"), ("hvdkit_peak", "g--s")):
        mem.plot(ranks, [rows[str(p)][kind] / 2**30 for p in ranks], style, label=kind.replace("_", " "))
    mem.set_title(f"memory per rank, Adam fp32, {z['large_parameters'] / 1e9:.1f} B parameters", fontsize=9)
    mem.set_ylabel("GB per rank")
    for g, row in z["rates"].items():
        line = eff.plot(ranks, [row[str(p)]["plain"]["step_s"] for p in ranks], "-o", label=f"plain {g} Gbit/s")
        color = line[0].get_color()
        eff.plot(ranks, [row[str(p)]["sharded"]["step_s"] for p in ranks], "--s", color=color, label=f"sharded {g}")
        measured = z["rates_measured_factor"][g]
        eff.plot(
            ranks,
            [measured[str(p)]["step_s"] for p in ranks],
            ":^",
            color=color,
            label=f"sharded {g}, x{z['comm_factor']:.2f} comm",
        )
    eff.set_title(f"predicted step time, section's model ({z['parameters'] / 1e6:.1f} M parameters)", fontsize=9)
    eff.set_ylabel("seconds per step")
    eff.set_ylim(bottom=0)
    for ax in (mem, eff):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("ranks (one per host)")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    return save_figure(fig, path)
