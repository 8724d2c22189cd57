"""The checkpoint manifest: sealed with its own SHA-256, and read back with every field checked.

A manifest names each file of a checkpoint with its size and SHA-256, so a damaged data file is
found. The manifest itself is sealed too (format 2): ``manifest_sha256`` is the SHA-256 of the
canonical JSON of every other field, so a changed step, world size or meta is found as well.
Format 1 manifests (hvdkit before the seal) carry no seal and are read with type checks only.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from ..errors import CheckpointError

__all__ = ["FORMAT", "SEAL", "seal", "check"]

FORMAT = 2
SEAL = "manifest_sha256"
_UNSEALED_FORMATS = (1,)


def _digest(body):
    """SHA-256 of ``body`` as canonical JSON (as it reads back: tuples are lists, keys strings)."""
    as_read = json.loads(json.dumps(body, sort_keys=True))
    text = json.dumps(as_read, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(text.encode("ascii")).hexdigest()


def seal(manifest: dict[str, Any]) -> dict[str, Any]:
    """``manifest`` with its format set to FORMAT and its seal added (a new dict)."""
    body = {k: v for k, v in manifest.items() if k != SEAL}
    body["format"] = FORMAT
    return {**body, SEAL: _digest(body)}


def _whole_number(value):
    return isinstance(value, int) and not isinstance(value, bool)


def check(path: str, manifest: Any) -> None:
    """Raise CheckpointError unless ``manifest`` (parsed JSON of checkpoint ``path``) is intact and well-formed."""
    if not isinstance(manifest, dict):
        raise CheckpointError(f"{path}: unreadable manifest (a JSON object expected, got {type(manifest).__name__})")
    if SEAL in manifest:
        body = {k: v for k, v in manifest.items() if k != SEAL}
        if body.get("format") in _UNSEALED_FORMATS or manifest[SEAL] != _digest(body):
            raise CheckpointError(f"{path}: the manifest does not match its own SHA-256 (corrupted)")
    elif manifest.get("format") not in _UNSEALED_FORMATS:
        raise CheckpointError(f"{path}: the manifest has no {SEAL} (corrupted, or written by a newer hvdkit)")
    for key in ("step", "epoch", "world_size"):
        if not _whole_number(manifest.get(key)) or manifest[key] < 0:
            raise CheckpointError(f"{path}: unreadable manifest ({key} is {manifest.get(key)!r}, not a whole number)")
    files = manifest.get("files")
    if not isinstance(files, dict):
        raise CheckpointError(f"{path}: unreadable manifest (files is {type(files).__name__}, not an object)")
    for name, entry in files.items():
        if not (isinstance(entry, dict) and _whole_number(entry.get("size")) and isinstance(entry.get("sha256"), str)):
            raise CheckpointError(f"{path}: unreadable manifest (the entry of {name!r} is {entry!r})")
