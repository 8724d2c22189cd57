"""``python -m benchmarks COMMAND [...]``: the lab's commands (suite, network, predict, zero, tune, elastic,
chaos, controller-wait, discovery-poll, synchronize-wait), one module each.

Run from the repository root (``benchmarks`` is not installed); ``python -m benchmarks COMMAND -h``
lists a command's flags.
"""

import importlib
import sys

__all__ = ["COMMANDS", "main"]

COMMANDS = {
    "suite": "hvdkit bench's suite, then the results section of docs/benchmarks.md (make bench)",
    "network": "two emulated hosts over shaped links; root, about 20 minutes (make bench-network)",
    "predict": "the scaling model on the recorded results, no jobs (make bench-predict)",
    "zero": "section (h) alone: ZeRO-1 memory, step time, bytes on the wire (docs/bench/zero-*)",
    "tune": "hvdkit tune: trials per hour at --parallel 1 vs 2, search vs grid (docs/bench/tune-*)",
    "elastic": "recovery times: hvdkit run --min-np (restarts) vs Horovod's hvd.elastic.run (docs/bench/elastic-*)",
    "chaos": "a Trainer job under a SIGKILL every S s: useful throughput per way of recovering (docs/bench/chaos-*)",
    "controller-wait": "Horovod's MPI controller: waits that sleep (fix 20) vs spin (docs/bench/controller-wait-*)",
    "discovery-poll": "a run of the host discovery script: Python middleman vs own child (docs/bench/discovery-poll-*)",
    "synchronize-wait": "a torch rank waiting in synchronize(): yield (before fix 80) vs sleep (docs/bench/sync*)",
}


def usage():
    lines = [
        "usage: python -m benchmarks {" + ",".join(COMMANDS) + "} [-h] [...]",
        "",
        "The project's own benchmark lab (from the repository root):",
    ]
    lines += [f"  {name:<15} {what}" for name, what in COMMANDS.items()]
    return "\n".join(lines)


def main(argv=None):
    """Dispatch to ``benchmarks.<command>.main(rest)``; the exit code."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(usage(), file=sys.stdout if argv else sys.stderr)
        return 0 if argv else 2
    if argv[0] not in COMMANDS:
        print(f"{usage()}\n\nunknown command {argv[0]!r}", file=sys.stderr)
        return 2
    from hvdkit.core.errors import HvdkitError

    try:
        return importlib.import_module(f"benchmarks.{argv[0].replace('-', '_')}").main(argv[1:])
    except HvdkitError as e:  # hvdkit's rule: one line, exit 2
        print(f"python -m benchmarks {argv[0]}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
