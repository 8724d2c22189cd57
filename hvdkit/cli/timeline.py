"""``hvdkit timeline``: summarise a Horovod timeline (time per tensor and activity, communication against waits)."""

from __future__ import annotations

import argparse
import sys

__all__ = ["register", "main"]


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``hvdkit timeline`` to the sub-command parsers ``sub``."""
    t = sub.add_parser(
        "timeline",
        help="summarise a Horovod timeline: time per tensor and activity, communication against waits",
        description="Summarise a timeline written by 'hvdkit run --timeline FILE'. Example: hvdkit timeline "
        "tl.json --top 5 --json tl-summary.json --plot tl.png",
    )
    t.add_argument("file", metavar="FILE", help="the timeline (HOROVOD_TIMELINE) file")
    t.add_argument("--json", metavar="OUT", help="also write the whole summary as JSON to OUT")
    t.add_argument("--plot", metavar="OUT.png", help="also draw the top tensors and the span breakdown to OUT.png")
    t.add_argument("--top", type=int, default=10, metavar="K", help="tensors to show (default 10)")


def main(args: argparse.Namespace) -> int:
    """Run ``hvdkit timeline`` from parsed arguments; the exit code."""
    from ..core.options import check_positive_int
    from ..diagnostics import timeline, timeline_plot

    check_positive_int("--top", args.top)
    summary = timeline.summarise(args.file)
    sys.stdout.write(timeline.format_summary(summary, args.top))
    if args.json:
        timeline.write_json(summary, args.json, args.top)
    if args.plot:
        timeline_plot.plot(summary, args.plot, args.top)
    return 0
