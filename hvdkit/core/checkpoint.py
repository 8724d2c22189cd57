"""The rank-0 checkpoint protocol, framework-free.

Layout under the checkpoint root::

    ckpt-000000000040/            one complete checkpoint (step 40)
        state.pt                  files written by the framework adapter
        manifest.json             step, epoch, world size, versions, size and SHA-256 of every file
    .tmp-ckpt-...                 a write in progress (never loaded; removed by the next save)

Only rank 0 touches the file system. A save writes into a temporary folder, fsyncs every file and
the folder, renames it into place and fsyncs the root, so a crash at any point leaves either the old
set of checkpoints or the new one, never a half-written checkpoint under a ``ckpt-`` name. The
outcome is broadcast, so when rank 0 fails every rank raises the same CheckpointError.
Loading walks the checkpoints newest first, verifies each manifest (sizes and checksums), skips and
reports the ones that fail, and broadcasts the first good state to every rank.
"""

import hashlib
import json
import os
import re
import shutil
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from .errors import CheckpointError, ConfigError
from .log import get_logger

__all__ = ["CheckpointStore", "CheckpointInfo", "Resumed", "MANIFEST"]

MANIFEST = "manifest.json"
_PREFIX = "ckpt-"
_NAME = re.compile(r"^ckpt-(\d{12})$")
_TMP = ".tmp-"
_log = get_logger("checkpoint")
_DELETERS = {}  # root -> the thread deleting that root's pruned checkpoints (see _prune)


@dataclass(frozen=True)
class CheckpointInfo:
    """A complete, verified checkpoint."""

    path: str
    step: int
    epoch: int
    world_size: int
    manifest: dict


@dataclass(frozen=True)
class Resumed:
    """What a framework adapter's ``restore()`` brought back (``epoch``: epochs completed)."""

    step: int
    epoch: int
    extra: object
    path: str
    world_size: int


def fsync_path(path, directory=False):
    """fsync a file (or, with ``directory``, a folder's entries) so it survives a crash."""
    fd = os.open(path, os.O_RDONLY | (os.O_DIRECTORY if directory else 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _sync_and_hash(folder):
    """{name: {size, sha256}} of every file in ``folder``, each fsynced.

    The fsyncs (disk writes) run in a thread while this one hashes the files (page-cache reads);
    both release the GIL, so a save costs about max(fsync, hash) instead of their sum.
    """
    paths = {}
    for name in sorted(os.listdir(folder)):
        fpath = os.path.join(folder, name)
        if os.path.islink(fpath) or not os.path.isfile(fpath):
            raise CheckpointError(f"write() left {name!r}, which is not a regular file")
        paths[name] = fpath
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="hvdkit-fsync") as pool:
        synced = pool.map(fsync_path, paths.values())
        files = {name: {"size": os.path.getsize(p), "sha256": _sha256(p)} for name, p in paths.items()}
        list(synced)  # re-raises an fsync error
    return files


def _remove_all(paths, previous):
    if previous is not None:
        previous.join()  # one deleter at a time, in order
    for path in paths:
        shutil.rmtree(path, ignore_errors=True)


def _version():
    from .. import __version__

    return __version__


def verify(path):
    """The manifest of the checkpoint folder ``path`` after checking every file; else CheckpointError."""
    if os.path.islink(path) or not os.path.isdir(path):
        raise CheckpointError(f"{path} is not a checkpoint folder (links are not followed)")
    mpath = os.path.join(path, MANIFEST)
    try:
        with open(mpath, encoding="utf-8") as f:
            manifest = json.load(f)
        files = manifest["files"]
        int(manifest["step"]), int(manifest["epoch"]), int(manifest["world_size"])
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise CheckpointError(f"{path}: unreadable manifest ({e})") from None
    for name, entry in files.items():
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


class CheckpointStore:
    """Rank-0 checkpoints under ``root``, shared by the framework adapters.

    Collective: the constructor, ``save`` and ``load`` must be called by every rank. The
    constructor checks on rank 0 that ``root`` can be created and written, so a bad path fails
    on every rank before any training happens.
    """

    def __init__(self, root, comm, keep=3, framework="none"):
        if not isinstance(keep, int) or keep < 1:
            raise ConfigError(f"keep must be an integer >= 1 (got {keep!r}): how many checkpoints to keep")
        self.root = os.path.abspath(os.fspath(root))
        self.comm = comm
        self.keep = keep
        self.framework = framework
        error = self._check_writable() if comm.is_rank0 else None
        error = comm.broadcast_object(error, name="hvdkit.checkpoint.preflight")
        if error:
            raise CheckpointError(error)

    def _check_writable(self):
        try:
            os.makedirs(self.root, exist_ok=True)
            probe = os.path.join(self.root, f"{_TMP}probe-{os.getpid()}")
            with open(probe, "w") as f:
                f.write("ok")
            os.remove(probe)
        except OSError as e:
            return (
                f"checkpoint directory {self.root!r} is not writable ({e.strerror or e}); "
                "pass a directory rank 0 can create and write (--checkpoint-dir)"
            )
        return None

    # ---------------------------------------------------------------- listing (rank 0)
    def candidates(self):
        """``(step, path)`` of every ``ckpt-`` folder, newest first, unverified."""
        try:
            names = os.listdir(self.root)
        except FileNotFoundError:
            return []
        found = [(int(m.group(1)), os.path.join(self.root, n)) for n in names if (m := _NAME.match(n))]
        return sorted(found, reverse=True)

    def latest(self):
        """The newest checkpoint that verifies (rank 0 only; no collective), or None.

        Checkpoints that fail verification are reported and skipped.
        """
        for _, path in self.candidates():
            try:
                m = verify(path)
            except CheckpointError as e:
                _log.warning("skipping checkpoint: %s; falling back to an older one", e)
                continue
            return CheckpointInfo(path, int(m["step"]), int(m["epoch"]), int(m["world_size"]), m)
        return None

    # ---------------------------------------------------------------- save
    def save(self, write, step, epoch, meta=None):
        """Write a checkpoint of ``step`` on rank 0; ``write(folder)`` puts the files in ``folder``.

        Returns the checkpoint's path on every rank. Raises CheckpointError on every rank when
        rank 0 could not write it; earlier checkpoints are then left untouched.
        Collective: every rank calls it; only rank 0 calls ``write``.
        """
        result = None
        if self.comm.is_rank0:
            try:
                result = ("ok", self._write(write, int(step), int(epoch), meta or {}))
            except Exception as e:  # noqa: BLE001 - any failure must reach every rank
                result = ("error", f"saving the checkpoint of step {step} to {self.root!r} failed: {e}")
        status, value = self.comm.broadcast_object(result, name="hvdkit.checkpoint.save")
        if status != "ok":
            raise CheckpointError(value)
        return value

    def _write(self, write, step, epoch, meta):
        t0 = time.perf_counter()
        self.wait_for_cleanup()  # the previous save's deletions (normally long done)
        tmp = os.path.join(self.root, f"{_TMP}{_PREFIX}{step:012d}-{uuid.uuid4().hex[:8]}")
        os.makedirs(tmp)
        try:
            write(tmp)
            files = _sync_and_hash(tmp)
            manifest = {
                "format": 1,
                "step": step,
                "epoch": epoch,
                "world_size": self.comm.size,
                "framework": self.framework,
                "hvdkit_version": _version(),
                "created": time.time(),
                "files": files,
                "meta": meta,
            }
            mpath = os.path.join(tmp, MANIFEST)
            with open(mpath, "w", encoding="utf-8") as f:
                json.dump(manifest, f, indent=1, sort_keys=True)
                f.flush()
                os.fsync(f.fileno())
            fsync_path(tmp, directory=True)
            final = os.path.join(self.root, f"{_PREFIX}{step:012d}")
            if os.path.lexists(final):  # the same step saved again (e.g. after a resume)
                aside = os.path.join(self.root, f"{_TMP}old-{uuid.uuid4().hex[:8]}")
                os.rename(final, aside)
                os.rename(tmp, final)
                shutil.rmtree(aside, ignore_errors=True)
            else:
                os.rename(tmp, final)
            fsync_path(self.root, directory=True)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        self._prune(keep_path=final)
        _log.info("saved checkpoint step %d epoch %d in %.3f s: %s", step, epoch, time.perf_counter() - t0, final)
        return final

    def _prune(self, keep_path):
        """Keep the newest ``keep`` checkpoints; remove older ones and leftovers of dead writes.

        What goes is first renamed out of the ``ckpt-`` namespace (instant: the listing is right
        when ``save`` returns), then deleted by a background thread, so freeing a large checkpoint's
        disk blocks does not hold up training. The thread is not a daemon: a process waits for
        it before exiting. A process killed mid-deletion leaves a ``.tmp-`` folder that the next
        save removes.
        """
        doomed = [path for _, path in self.candidates()[self.keep :] if path != keep_path]
        doomed += [os.path.join(self.root, n) for n in os.listdir(self.root) if n.startswith(_TMP)]
        trash = []
        for path in doomed:
            aside = os.path.join(self.root, f"{_TMP}trash-{uuid.uuid4().hex[:8]}")
            try:
                os.rename(path, aside)
            except OSError:  # being deleted by an earlier save's thread
                continue
            trash.append(aside)
        if trash:
            deleter = threading.Thread(target=_remove_all, args=(trash, _DELETERS.get(self.root)), daemon=False)
            _DELETERS[self.root] = deleter
            deleter.start()

    def wait_for_cleanup(self):
        """Block until pruned checkpoints under this root are deleted (rank 0; no collective)."""
        deleter = _DELETERS.get(self.root)
        if deleter is not None:
            deleter.join()

    # ---------------------------------------------------------------- load
    def load(self, read):
        """Restore the newest good checkpoint on every rank: ``(state, CheckpointInfo)`` or None.

        Like ``load_on_rank0``, then rank 0's whole state is pickled and broadcast: meant for
        small states (under 2 GiB, and it costs time on every rank). The framework adapters
        restore through ``load_on_rank0`` and send tensors in chunks instead.
        Collective: every rank calls it; only rank 0 calls ``read``.
        """
        loaded = self.load_on_rank0(read)
        if loaded is None:
            return None
        state, _, info = loaded
        return self.comm.broadcast_object(state, name="hvdkit.checkpoint.load.state"), info

    def load_on_rank0(self, read, describe=None):
        """Read the newest good checkpoint on rank 0 and tell every rank which one it is.

        Rank 0 walks the checkpoints newest first and calls ``read(folder)`` on the first that
        verifies; a checkpoint that fails verification or ``read`` is reported and skipped. Then
        rank 0 calls ``describe(state, info)`` (if given): its result, the header, must be small,
        since it is broadcast with the outcome. Returns ``(state, header, info)`` on rank 0,
        ``(None, header, info)`` on the other ranks, None on every rank when there is no
        checkpoint. Any failure on rank 0 (the folder cannot be listed, no checkpoint loads,
        ``describe`` raises) raises CheckpointError on every rank, so no rank waits for another.
        Collective: every rank calls it; only rank 0 touches the file system.
        """
        outcome, state = None, None
        if self.comm.is_rank0:
            try:
                outcome, state = self._open_newest(read, describe)
            except CheckpointError as e:
                outcome = ("error", str(e))
            except Exception as e:  # noqa: BLE001 - any failure must reach every rank
                outcome = ("error", f"reading the checkpoints under {self.root!r} failed on rank 0 ({type(e).__name__}: {e}); "
                           "pass a checkpoint directory that rank 0 can list and read (--checkpoint-dir)")
        status, value = self.comm.broadcast_object(outcome, name="hvdkit.checkpoint.load")
        if status == "error":
            raise CheckpointError(value)
        if value is None:
            return None
        header, info = value
        return state, header, info

    def _open_newest(self, read, describe):
        """Rank 0: ``(outcome to broadcast, state)``; raises on any failure."""
        self.wait_for_cleanup()
        found = self._read_newest(read)
        if found is None:
            return ("ok", None), None
        state, info = found
        header = describe(state, info) if describe is not None else None
        return ("ok", (header, info)), state

    def _read_newest(self, read):
        """Rank 0: ``(state, CheckpointInfo)`` of the newest checkpoint that verifies and reads, or None."""
        skipped = []
        for _, path in self.candidates():
            try:
                m = verify(path)
                state = read(path)
            except Exception as e:  # noqa: BLE001 - a bad checkpoint must not stop the fallback
                _log.warning("skipping checkpoint %s: %s", path, e)
                skipped.append(path)
                continue
            if skipped:
                _log.warning("resuming from %s after skipping %d newer checkpoint(s)", path, len(skipped))
            return state, CheckpointInfo(path, int(m["step"]), int(m["epoch"]), int(m["world_size"]), m)
        if skipped:
            raise CheckpointError(f"no checkpoint under {self.root!r} could be loaded; skipped: {', '.join(skipped)}")
        return None
