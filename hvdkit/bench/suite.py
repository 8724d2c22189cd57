"""``hvdkit bench``'s suite: measure Horovod through hvdkit where it runs, side by side with the alternatives.

Its flags are ``hvdkit.cli.bench``'s. Each section is a separate job started the way users start
theirs (``hvdkit run``), so the figures include everything a user pays for. Within a job the
variants of one comparison run interleaved and every variant's result is checked before it is
timed (see the workers: ``comm_bench``, ``train_bench``, ``keras_bench``, ``ckpt_bench``,
``zero_bench``). ``--quick`` runs every variant on tiny sizes once: a correctness check of the suite
(``make test`` runs it), not a measurement.
"""

from __future__ import annotations

import time
from typing import Any

from ..core.errors import ConfigError
from . import report
from .jobs import Suite, busy_warning, machine, publish, say

__all__ = ["run_suite"]


def run_suite(out: str, np_: int = 2, quick: bool = False, tune: bool = True) -> dict[str, Any]:
    """Every section; returns the assembled results (also written to ``out``/results.json)."""
    if np_ < 2:
        raise ConfigError(f"-np must be at least 2 (got {np_}): the suite compares 1 rank with N")
    t0 = time.perf_counter()
    suite = Suite(out, np_, quick)
    reps = 1 if quick else 5
    results = {"machine": machine(), "quick": quick, "ranks": np_}
    say(f"{np_} ranks on {results['machine']['cores']} cores; results go to {out}")
    busy = busy_warning(results["machine"]["load_average_at_start"][0], results["machine"]["cores"])
    if busy and not quick:
        say(busy)
    results["comm_mpi"] = suite.job("comm_mpi", "comm_bench")
    results["comm_gloo"] = suite.job("comm_gloo", "comm_bench", gloo=True)
    results["train_torch"] = suite.job("train_torch", "train_bench")
    results["train_keras"] = suite.job("train_keras", "keras_bench")
    results["checkpoint"] = suite.job("checkpoint", "ckpt_bench", ranks=False)
    results["zero"] = suite.zero()
    results["startup"] = suite.startup(reps * 2)
    say("startup: done")
    if tune and not quick:
        results["tuning"] = suite.tuning(3)
    results["goals"] = report.goals(results)
    return publish(results, out, report, t0)
