"""Draw a timeline ``Summary`` to a PNG; matplotlib is imported only when a plot is drawn."""

from __future__ import annotations

import os

from ..core.errors import ConfigError, MissingDependencyError
from .timeline import CATEGORIES, OTHER, Summary, format_ms

__all__ = ["plot"]


def plot(summary: Summary, out: str | os.PathLike[str], top: int = 10) -> None:
    """Write a PNG of a timeline ``Summary``: stacked activity times per top tensor, and the breakdown
    of the span (needs matplotlib; its absence is a clear error)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise MissingDependencyError("--plot needs matplotlib: pip install matplotlib (or hvdkit[bench])") from None
    shown = summary.tensors[:top][::-1]  # matplotlib draws the first bar at the bottom
    names = sorted({a for t in shown for a in t.activities}, key=lambda a: (a == OTHER, a))
    fig, (left, right) = plt.subplots(
        1, 2, figsize=(12, 2.5 + 0.45 * max(len(shown), 4)), gridspec_kw={"width_ratios": [3, 1]}
    )
    segments = [("negotiation", [t.negotiate_us / 1000 for t in shown])]
    segments += [(a, [t.activities.get(a, 0) / 1000 for t in shown]) for a in names]
    base = [0.0] * len(shown)
    for label, widths in segments:
        left.barh([t.name for t in shown], widths, left=base, label=label)
        base = [b + w for b, w in zip(base, widths, strict=True)]
    left.set_xlabel("ms (per tensor; fused tensors share time)")
    left.set_title(f"top {len(shown)} tensors: negotiation and operation activities")
    left.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=4)
    bottom = 0.0
    for c in CATEGORIES:
        share = 100 * summary.fractions[c]
        right.bar(["span"], [share], bottom=bottom, label=f"{c} {share:.1f}%")
        bottom += share
    right.set_ylabel(f"% of span ({format_ms(summary.span_us)} ms)")
    right.set_title("where the span went")
    right.legend(fontsize=7)
    fig.tight_layout()
    try:
        fig.savefig(out, dpi=100)
    except OSError as e:
        raise ConfigError(f"cannot write --plot {out!r}: {e.strerror}; choose a writable path") from None
    finally:
        plt.close(fig)
