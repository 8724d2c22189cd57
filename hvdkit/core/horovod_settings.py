"""The Horovod engine settings hvdkit chooses: cycle time, response cache, fusion threshold, per transport.

Horovod's background thread negotiates once per cycle (``HOROVOD_CYCLE_TIME``, 1 ms by default);
a collective submitted just after a round waits for the next one, so a small allreduce costs about
one cycle however small it is, and a shorter cycle costs CPU: the thread wakes and negotiates
with the other ranks every cycle, also when nothing is pending. Measured (docs/benchmarks.md,
"Latency settings"): over MPI a 0.2 ms cycle brings a 4 KB allreduce from 1.07 to 0.26 ms with no
measurable cost to the training step on 16 cores (with one core per rank, up to ~5 % in the quiet
2-core run, inside its spread; ``HOROVOD_CYCLE_TIME=1`` takes Horovod's); over Gloo each round
costs more (0.36 ms at best, and 0.2 cores per rank while idle at 0.2 ms), so Gloo gets 0.5 ms
(0.56 ms, 0.1 core). Over MPI the idle cost is the background thread's wait for the other ranks:
Open MPI's blocking collectives polled (one rank of an idle job held a core); engine fix 20 waits
without polling (the two ranks of an idle job at 0.2 ms: about half a core together, "The MPI
controller's wait" in docs/benchmarks.md). The response cache
and the fusion threshold keep Horovod's values. A variable the user set wins.

A rank that trains on a GPU (NCCL moves the gradients) gets 5 ms over either transport: measured on
an H200 with 2 ranks sharing it (docs/gpu.md, 2026-11-28), each negotiation round's gradients become
one NCCL allreduce, and at 0.5-1 ms ResNet-50's backward sent ~40 small ones, each paying NCCL's
per-call latency: the step was 0.54x DDP's at 0.5 ms, 0.66x at 1 ms, 0.81x at 2 ms, 0.95x at 5 ms,
0.99x at 10 ms (with ``bucket_mb``, the GPU default of ``hk.DistributedOptimizer``: 1.05x at 5 ms,
1.04x at 2 ms; BERT-base 1.05x). A small model whose step is a few milliseconds may want less:
``HOROVOD_CYCLE_TIME`` set by the user wins.

An empty variable is not a value: Horovod reads ``HOROVOD_CYCLE_TIME=""`` as a cycle of 0 ms (its
background thread never sleeps: 8.6 s of CPU per rank in 10 idle seconds here, against 1.4 s), and an
empty ``HOROVOD_FUSION_THRESHOLD`` or ``HOROVOD_CACHE_CAPACITY`` as 0 (no fusion, no response cache).
``engine_settings`` gives such a variable hvdkit's value, or Horovod's own where hvdkit keeps Horovod's.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from . import env as _env

__all__ = ["DEFAULTS", "GPU_DEFAULTS", "HOROVOD_DEFAULTS", "transport", "engine_settings"]

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
# A rank training on a GPU, over either transport (the values above are for CPU tensors).
GPU_DEFAULTS = {_env.HOROVOD_CYCLE_TIME: "5"}


def transport(environ: Mapping[str, str]) -> str:
    """``"gloo"`` in a job started by ``horovodrun --gloo`` (its rendezvous variable is set), else ``"mpi"``."""
    return "gloo" if _env.HOROVOD_GLOO_RENDEZVOUS_ADDR in environ else "mpi"


def engine_settings(environ: Mapping[str, str] | None = None, gpu: bool = False) -> dict[str, str]:
    """The Horovod variables hvdkit sets before Horovod starts: ``{name: value}`` for those not set already, and
    for those set to an empty value (which Horovod reads as 0): hvdkit's value, else Horovod's default.

    ``gpu``: the rank trains on a GPU (``GPU_DEFAULTS`` over the transport's values).
    Env: HOROVOD_CYCLE_TIME, HOROVOD_CACHE_CAPACITY, HOROVOD_FUSION_THRESHOLD (a value set wins),
    HOROVOD_GLOO_RENDEZVOUS_ADDR (which transport's values apply).
    """
    environ = os.environ if environ is None else environ
    values = {**DEFAULTS[transport(environ)], **(GPU_DEFAULTS if gpu else {})}
    chosen = {k: v for k, v in values.items() if k not in environ}
    blank = {k: values.get(k, v) for k, v in HOROVOD_DEFAULTS.items() if k in environ and not environ[k].strip()}
    return {**chosen, **blank}
