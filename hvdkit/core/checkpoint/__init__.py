"""Checkpoints, framework-free: the rank-0 store and the files it writes, verifies and locks.

``store`` (CheckpointStore: save, prune, find the newest that verifies), ``state`` (what a
checkpoint holds for every framework, and how it comes back), ``folder`` (crash-safe file-system
steps), ``lock`` (one job per folder), ``manifest`` (the sealed list of files), ``arrays`` (the
arrays file), ``tree`` (state trees and RNG states), ``plain_data`` (what would not read back).
The format is described in docs/checkpoint-format.md.
"""

from .folder import fsync_path
from .store import MANIFEST, CheckpointInfo, CheckpointStore, Resumed, verify

__all__ = ["CheckpointStore", "CheckpointInfo", "Resumed", "MANIFEST", "verify", "fsync_path"]
