"""Framework-free core: what the adapters, the launcher and the tools share, in four groups.

- Ground: ``errors``, ``env`` (every variable), ``options``, ``log``, ``engine_import``,
  ``horovod_settings``, ``deprecation``.
- The rank's process: ``topology``, ``devices``, ``comm`` (the ``Communicator`` interface),
  ``runtime``, ``preemption``, ``recovery`` (in-process recovery's shared parts).
- Training arithmetic: ``metrics``, ``lr``, ``data``, ``zero``, ``autocompress``.
- Channels, what leaves a running job: ``checkpoint`` (to disk and back), ``monitoring`` (progress,
  stragglers, tracking), ``tune_channel`` (to ``hvdkit tune``).

Imports the standard library only (numpy at most), never a framework or Horovod
(docs/architecture.md, "The core in four groups").
"""

from .checkpoint.store import CheckpointInfo, CheckpointStore
from .comm import Communicator, LocalCommunicator
from .devices import choose_gpu
from .errors import (
    CheckpointError,
    CollectiveError,
    ConfigError,
    HvdkitError,
    LaunchError,
    MissingDependencyError,
)
from .log import get_logger
from .lr import lr_scale, scaled_lr, warmup_factor
from .metrics import MetricTracker, average_metrics, sum_states
from .monitoring.progress import Progress
from .monitoring.straggler import StragglerMonitor, StragglerReport
from .monitoring.tracking import Tracker
from .options import COMPRESSIONS, check_compression
from .preemption import PreemptionGuard
from .topology import Topology, from_env

__all__ = [
    "CheckpointError",
    "CheckpointInfo",
    "CheckpointStore",
    "CollectiveError",
    "COMPRESSIONS",
    "Communicator",
    "ConfigError",
    "HvdkitError",
    "LaunchError",
    "LocalCommunicator",
    "MetricTracker",
    "MissingDependencyError",
    "PreemptionGuard",
    "Progress",
    "StragglerMonitor",
    "StragglerReport",
    "Topology",
    "Tracker",
    "average_metrics",
    "check_compression",
    "choose_gpu",
    "from_env",
    "get_logger",
    "lr_scale",
    "scaled_lr",
    "sum_states",
    "warmup_factor",
]
