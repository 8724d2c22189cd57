"""What the straggler workers share: the rank's hvdkit.straggler log lines, and the sleeps that make rank 1 slow."""

import logging

BASE_SLEEP = 0.020  # every rank's "compute" per step: a sleep, so CPU contention barely changes it
EXTRA_SLEEP = 0.050  # rank 1's extra time per step in the slowed epoch
THRESHOLD = 1.5  # loose: a 2-core shared machine is noisy; the slowed rank is expected near 3.5x


def capture_straggler_log():
    """A list that fills with this rank's hvdkit.straggler log lines as "LEVEL: message"."""
    lines = []
    handler = logging.Handler()
    handler.emit = lambda record: lines.append(f"{record.levelname}: {record.getMessage()}")
    logging.getLogger("hvdkit.straggler").addHandler(handler)
    return lines


def compute_seconds(rank, slowed):
    return BASE_SLEEP + (EXTRA_SLEEP if slowed and rank == 1 else 0.0)
