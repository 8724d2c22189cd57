"""``python tune_tiny_trial.py --epochs E --x X``: a trial with a known answer and no framework.

Reports ``loss = X`` for every epoch (``hvdkit.tune.report``), one epoch every ``0.15 * X`` seconds:
a worse trial is also a slower one, so a pruner sees a better trial ahead of it. On SIGTERM (the
preemption stop; SIGUSR1 too, as mpirun passes it on) it writes ``stopped.rank<r>`` (``epoch N``) into ``--trial-dir``, as a checkpoint
would be written, and exits 0; at the end it writes ``done.rank<r>``.
"""

import argparse
import os
import signal
import sys
import time

import hvdkit.tune

stop = False  # set by the stop signals hvdkit run passes to its ranks (SIGTERM, SIGUSR1)


def _on_term(signum, frame):
    global stop
    stop = True


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--epochs", type=int, required=True)
    p.add_argument("--x", type=float, required=True)
    p.add_argument("--trial-dir", required=True)
    args = p.parse_args()
    rank = os.environ.get("OMPI_COMM_WORLD_RANK", os.environ.get("HOROVOD_RANK", "0"))
    signal.signal(signal.SIGTERM, _on_term)
    signal.signal(signal.SIGUSR1, _on_term)
    for epoch in range(args.epochs):
        deadline = time.monotonic() + 0.15 * args.x
        while time.monotonic() < deadline and not stop:
            time.sleep(0.02)
        if stop:
            with open(os.path.join(args.trial_dir, f"stopped.rank{rank}"), "w") as f:
                f.write(f"epoch {epoch}\n")
            return 0
        hvdkit.tune.report(epoch, loss=args.x)
    with open(os.path.join(args.trial_dir, f"done.rank{rank}"), "w") as f:
        f.write(f"epoch {args.epochs - 1}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
