"""File-system steps of the checkpoint store that must survive a crash at any instant (rank 0).

``place`` puts a finished checkpoint under its ``ckpt-`` name, also when the step exists already;
``delete_later`` takes folders out of the ``ckpt-`` namespace at once and frees their disk blocks in
a background thread; ``signature`` tells whether a folder changed since it was last verified.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import threading
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from ..errors import CheckpointError
from ..log import get_logger
from . import manifest as _manifest

__all__ = [
    "MANIFEST",
    "fsync_path",
    "place",
    "delete_later",
    "wait_for_deletions",
    "signature",
    "listing",
    "sync_and_hash",
    "verify",
]

MANIFEST = "manifest.json"
_NAME = re.compile(r"^ckpt-(\d{12})(?:\.(\d{1,9}))?$")  # step, then the copy's generation (none: 0)

_log = get_logger("checkpoint")
_DELETERS = {}  # root -> the thread deleting that root's pruned checkpoints


def fsync_path(path: str, directory: bool = False) -> None:
    """fsync a file (or, with ``directory``, a folder's entries) so it survives a crash."""
    fd = os.open(path, os.O_RDONLY | (os.O_DIRECTORY if directory else 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def place(tmp: str, final: str, older: Sequence[tuple[int, str]], trash_path: Callable[[], str]) -> str:
    """Rename the finished, fsynced folder ``tmp`` in as ``final``; the path it ends under.

    ``older`` lists ``(generation, path)`` of the copies of the same step already there (a step
    saved again after a resume). Then the new copy goes in first under the next generation's name
    ``final.N`` (ranked above the older copies by the store's listing) and the root is fsynced;
    only then are the older copies renamed to ``trash_path()`` names and the new one to ``final``.
    At every instant a complete copy of the step is under a ``ckpt-`` name, so a crash (or a full
    disk) in between loses nothing. Once the new copy is in, a failure only leaves it at ``final.N``.
    """
    root = os.path.dirname(final)
    if not older:
        os.rename(tmp, final)
        fsync_path(root, directory=True)
        return final
    staged = f"{final}.{max(gen for gen, _ in older) + 1}"
    os.rename(tmp, staged)
    fsync_path(root, directory=True)
    try:
        for _, path in older:
            os.rename(path, trash_path())
        os.rename(staged, final)
        fsync_path(root, directory=True)
    except OSError as e:  # the new copy is in place and loads under the name it has
        _log.warning("checkpoint saved as %s; retiring the older copies of its step failed: %s", staged, e)
        return staged
    return final


def _remove_all(paths, previous):
    if previous is not None:
        previous.join()  # one deleter at a time, in order
    for path in paths:
        shutil.rmtree(path, ignore_errors=True)


def delete_later(
    root: str, paths: Iterable[str], trash_path: Callable[[], str], is_trash: Callable[[str], bool]
) -> None:
    """Rename ``paths`` under ``root`` to ``trash_path()`` names now, delete them in a thread.

    Paths for which ``is_trash(name)`` holds are out of the way already and only deleted. The
    thread is not a daemon: a process waits for it before exiting; one killed mid-deletion leaves
    a trash folder behind.
    """
    trash = []
    for path in paths:
        if is_trash(os.path.basename(path)):
            trash.append(path)
            continue
        aside = trash_path()
        try:
            os.rename(path, aside)
        except OSError:  # gone already
            continue
        trash.append(aside)
    if trash:
        deleter = threading.Thread(target=_remove_all, args=(trash, _DELETERS.get(root)), daemon=False)
        _DELETERS[root] = deleter
        deleter.start()


def wait_for_deletions(root: str) -> None:
    """Block until what ``delete_later`` took from ``root`` is deleted."""
    deleter = _DELETERS.get(root)
    if deleter is not None:
        deleter.join()


def signature(path: str) -> tuple | None:
    """What changes when a checkpoint folder's files change: (name, inode, size, mtime) of each."""
    try:
        return tuple(sorted((e.name, e.inode(), e.stat().st_size, e.stat().st_mtime_ns) for e in os.scandir(path)))
    except OSError:
        return None


def listing(root: str) -> list[tuple[int, int, str]]:
    """``(step, generation, path)`` of every ``ckpt-`` folder under ``root``, newest first, unverified."""
    try:
        names = os.listdir(root)
    except FileNotFoundError:
        return []
    found = [(int(m.group(1)), int(m.group(2) or 0), os.path.join(root, n)) for n in names if (m := _NAME.match(n))]
    return sorted(found, reverse=True)


def _sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def sync_and_hash(folder: str, hashed: dict[str, str] | None = None) -> dict[str, dict[str, Any]]:
    """{name: {size, sha256}} of every file in ``folder``, each fsynced.

    ``hashed`` gives the SHA-256 of files whose writer hashed them as it wrote (``write_arrays``);
    the other files are read and hashed here. The fsyncs (disk writes) run in a thread while this
    one hashes (page-cache reads); both release the GIL, so this costs about max(fsync, hash).
    """
    hashed = hashed or {}
    paths = {}
    for name in sorted(os.listdir(folder)):
        fpath = os.path.join(folder, name)
        if os.path.islink(fpath) or not os.path.isfile(fpath):
            raise CheckpointError(f"write() left {name!r}, which is not a regular file")
        paths[name] = fpath
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="hvdkit-fsync") as pool:
        synced = pool.map(fsync_path, paths.values())
        files = {
            name: {"size": os.path.getsize(p), "sha256": hashed.get(name) or _sha256(p)} for name, p in paths.items()
        }
        list(synced)  # re-raises an fsync error
    return files


def verify(path: str) -> dict[str, Any]:
    """The manifest of the checkpoint folder ``path`` after checking every file; else CheckpointError."""
    if os.path.islink(path) or not os.path.isdir(path):
        raise CheckpointError(f"{path} is not a checkpoint folder (links are not followed)")
    mpath = os.path.join(path, MANIFEST)
    try:
        with open(mpath, encoding="utf-8") as f:
            manifest = json.load(f)
    except (OSError, ValueError, RecursionError) as e:
        raise CheckpointError(f"{path}: unreadable manifest ({e})") from None
    _manifest.check(path, manifest)
    for name, entry in manifest["files"].items():
        if not isinstance(name, str) or name in ("", ".", "..", MANIFEST) or os.sep in name or "/" in name:
            raise CheckpointError(f"{path}: manifest names an unsafe file {name!r}")
        fpath = os.path.join(path, name)
        if os.path.islink(fpath) or not os.path.isfile(fpath):
            raise CheckpointError(f"{path}: {name} is missing or not a regular file")
        size = os.path.getsize(fpath)
        if size != entry.get("size"):
            raise CheckpointError(f"{path}: {name} has {size} bytes, the manifest says {entry.get('size')}")
        if _sha256(fpath) != entry.get("sha256"):
            raise CheckpointError(f"{path}: {name} does not match its SHA-256 in the manifest (corrupted)")
    return manifest
