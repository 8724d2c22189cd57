"""Process-wide state shared by the framework adapters: the started engine, topology, communicator.

The core never imports Horovod: an adapter hands in a function that returns its Horovod module
(``horovod.torch`` or ``horovod.tensorflow``, which share ``init/rank/size/local_rank/local_size``)
and a communicator class over it.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping
from signal import Signals
from types import ModuleType
from typing import TYPE_CHECKING

from . import env as _env
from . import log as _log
from .autocompress import wanted_compression
from .horovod_settings import engine_settings
from .lr import check_rule
from .lr import scaled_lr as _scaled_lr
from .metrics import average_metrics as _average_metrics
from .monitoring.straggler import straggler_threshold
from .options import AUTO
from .preemption import DEFAULT_SIGNALS, PreemptionGuard
from .topology import Topology

if TYPE_CHECKING:
    from .comm import Communicator
    from .metrics import MetricTracker

__all__ = ["Runtime", "RuntimePreemptionGuard", "check_rank_env"]


def check_rank_env(environ: Mapping[str, str] | None = None) -> None:
    """Read every HVDKIT_* variable a rank reads only later, so that a bad value fails now.

    HVDKIT_PROGRESS and HVDKIT_PROGRESS_INTERVAL (the first progress line), HVDKIT_STRAGGLER_THRESHOLD
    (the first straggler check) and HVDKIT_COMPRESSION (``compression="auto"``) would otherwise raise
    minutes or hours into a job. Raises ConfigError naming the variable, its text and the fix.
    """
    _env.flag(_env.PROGRESS, environ=environ)
    _env.seconds(_env.PROGRESS_INTERVAL, None, environ=environ)
    straggler_threshold(environ=environ)
    wanted_compression(AUTO, environ=environ)


class Runtime:
    """One adapter's view of the job: ``init``, ``topology``, ``rank``, ``size``, ``communicator``, ``scaled_lr``.

    ``on_start(topology, threads)`` runs once, after Horovod has started (thread settings) and
    returns what rank 0's start-up line says after "N rank(s) over MPI|Gloo; ", logged as
    ``hvdkit.<name>``. An adapter exports ``functions()`` under the names of ``FUNCTIONS``.
    """

    FUNCTIONS = (
        "init",
        "topology",
        "communicator",
        "average_metrics",
        "rank",
        "size",
        "local_rank",
        "local_size",
        "is_rank0",
        "scaled_lr",
    )

    def __init__(
        self,
        engine: Callable[[], ModuleType],
        make_comm: Callable[[], Communicator],
        on_start: Callable[[Topology, int | None], str],
        name: str,
        on_gpu: Callable[[], bool] = lambda: False,
    ) -> None:
        self._engine = engine
        self._on_gpu = on_gpu
        self._make_comm = make_comm
        self._on_start = on_start
        self._logger = _log.get_logger(name)
        self._comm = None

    def init(self, threads: int | None = None) -> Topology:
        """Start Horovod (once) and return this process's Topology.

        Also sets hvdkit's rank-prefixed logging and turns on Horovod's stall shutdown, so a rank
        that stops taking part in collectives ends the job with an error naming it.
        Also sets hvdkit's Horovod cycle time (``hvdkit.core.horovod_settings``; its GPU value where the
        rank will train on a GPU) unless it is set.
        Collective: every rank calls it.
        A bad value of an HVDKIT_* variable the ranks read later raises ConfigError here, on every
        rank (``check_rank_env``).
        Env: HVDKIT_STALL_TIMEOUT (seconds, default 600), unless HOROVOD_STALL_* are set;
        HOROVOD_CYCLE_TIME, HOROVOD_CACHE_CAPACITY, HOROVOD_FUSION_THRESHOLD (a value set wins).
        """
        hvd = self._engine()
        first = self._comm is None
        if first:
            check_rank_env()  # every rank, before Horovod starts: a bad value cannot leave a rank waiting
        if first and not (hasattr(hvd, "is_initialized") and hvd.is_initialized()):
            os.environ.update(_env.stall_settings())  # Horovod reads them when it starts
            os.environ.update(engine_settings(gpu=self._on_gpu()))
            hvd.init()
        topo = self.topology()
        _log.set_topology(topo)
        _log.configure()
        if first:
            detail = self._on_start(topo, threads)
            if topo.is_rank0:
                self._logger.info("%d rank(s) over %s; %s", topo.size, "MPI" if hvd.mpi_enabled() else "Gloo", detail)
            self._comm = self._make_comm()
        return topo

    def topology(self) -> Topology:
        """This process's Topology (needs ``init()``)."""
        hvd = self._engine()
        return Topology(hvd.rank(), hvd.size(), hvd.local_rank(), hvd.local_size())

    def communicator(self) -> Communicator:
        """The core communicator for this job (calls ``init()`` if needed)."""
        if self._comm is None:
            self.init()
        return self._comm

    def average_metrics(
        self, metrics: MetricTracker | Mapping[str, tuple[float, float]], name: str = "hvdkit.metrics"
    ) -> dict[str, float]:
        """Sample-weighted job-wide means of a MetricTracker (or ``{metric: (sum, count)}``).

        Collective: every rank calls it with the same metric names.
        """
        return _average_metrics(metrics, self.communicator(), name=name)

    def scaled_lr(self, base_lr: float, rule: str = "linear", size: int | None = None) -> float:
        """The learning rate for this job: ``base_lr`` x ``size`` ("linear"), x sqrt(``size``) ("sqrt") or x 1 ("none").

        ``base_lr`` is the rate tuned for one process with the per-rank batch (``hvdkit.core.lr``);
        ``size`` defaults to the job's number of ranks. A number: for a gradual start use the
        adapter's schedule (``hvdkit.torch.ScaledLRScheduler``, ``hvdkit.keras.ScaledLRSchedule``).
        """
        return _scaled_lr(base_lr, check_rule(rule), self.communicator().size if size is None else size)

    def rank(self) -> int:
        """This process's rank in the job, 0 .. size() - 1 (needs ``init()``)."""
        return self._engine().rank()

    def size(self) -> int:
        """The number of ranks in the job (needs ``init()``)."""
        return self._engine().size()

    def local_rank(self) -> int:
        """This process's rank among the ranks on its host (needs ``init()``)."""
        return self._engine().local_rank()

    def local_size(self) -> int:
        """The number of ranks on this process's host (needs ``init()``)."""
        return self._engine().local_size()

    def is_rank0(self) -> bool:
        """True on rank 0, the rank that logs, writes checkpoints and shows progress."""
        return self.rank() == 0

    def functions(self) -> tuple[Callable[..., object], ...]:
        """This runtime's methods named in ``FUNCTIONS``, in that order (what an adapter exports)."""
        return tuple(getattr(self, name) for name in self.FUNCTIONS)


class RuntimePreemptionGuard(PreemptionGuard):
    """``PreemptionGuard`` on the communicator of an adapter's Runtime (the subclass sets ``runtime``):
    after SIGTERM/SIGUSR1 on any rank, every rank's ``should_stop()`` returns True at the same step.

    Collective: every rank creates it and calls ``should_stop()`` the same number of times.
    Env: HVDKIT_JOB_ID (set by ``hvdkit run``).
    """

    runtime: Runtime | None = None  # the adapter's Runtime

    def __init__(self, every: int = 1, signals: Iterable[Signals] = DEFAULT_SIGNALS) -> None:
        super().__init__(self.runtime.communicator(), every=every, signals=signals)
