"""The Horovod engine settings hvdkit chooses: cycle time, response cache, fusion threshold, per transport.

Horovod's background thread negotiates once per cycle (``HOROVOD_CYCLE_TIME``, 1 ms by default);
a collective submitted just after a round waits for the next one, so a small allreduce costs about
one cycle however small it is, and a shorter cycle costs CPU: the thread wakes and negotiates
with the other ranks every cycle, also when nothing is pending. Measured (docs/benchmarks.md,
"Latency settings"): over MPI a 0.2 ms cycle brings a 4 KB allreduce from 1.07 to 0.26 ms with no
measurable cost to the training step on 16 cores (with one core per rank, up to ~5 % in the quiet
2-core run, inside its spread; ``HOROVOD_CYCLE_TIME=1`` takes Horovod's); over Gloo each round
costs more (0.36 ms at best, and 0.2 cores per rank while idle at 0.2 ms), so Gloo gets 0.5 ms
(0.56 ms, 0.1 core). The response cache
and the fusion threshold keep Horovod's values. A variable the user set wins.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from . import env as _env

__all__ = ["DEFAULTS", "HOROVOD_DEFAULTS", "transport", "engine_settings"]

# Horovod 0.28.1's own values, for comparison (docs/benchmarks.md runs both).
HOROVOD_DEFAULTS = {
    _env.HOROVOD_CYCLE_TIME: "1",
    _env.HOROVOD_CACHE_CAPACITY: "1024",
    _env.HOROVOD_FUSION_THRESHOLD: str(128 << 20),
}
# hvdkit's, per transport: what Horovod's controller and data path run over.
DEFAULTS = {
    "mpi": {_env.HOROVOD_CYCLE_TIME: "0.2"},
    "gloo": {_env.HOROVOD_CYCLE_TIME: "0.5"},
}


def transport(environ: Mapping[str, str]) -> str:
    """``"gloo"`` in a job started by ``horovodrun --gloo`` (its rendezvous variable is set), else ``"mpi"``."""
    return "gloo" if _env.HOROVOD_GLOO_RENDEZVOUS_ADDR in environ else "mpi"


def engine_settings(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The Horovod variables hvdkit sets before Horovod starts: ``{name: value}`` for those not set already.

    Env: HOROVOD_CYCLE_TIME, HOROVOD_CACHE_CAPACITY, HOROVOD_FUSION_THRESHOLD (a value set wins),
    HOROVOD_GLOO_RENDEZVOUS_ADDR (which transport's values apply).
    """
    environ = os.environ if environ is None else environ
    return {k: v for k, v in DEFAULTS[transport(environ)].items() if k not in environ}
