"""The rank-0 checkpoint protocol, framework-free.

Layout under the checkpoint root::

    ckpt-000000000040/            one complete checkpoint (step 40)
        arrays.npz                the tensors of the state (state.py, arrays.py)
        manifest.json             step, epoch, world size, versions, size and SHA-256 of every file,
                                  ``meta`` (the state's layout, ``extra``, every rank's RNG states),
                                  sealed by the SHA-256 of the manifest itself (core/manifest.py)
    ckpt-000000000040.1/          a newer copy of step 40, while a save of step 40 again replaces it
    .tmp-<job>-...                a write in progress or a deletion (never loaded)
    .hvdkit.lock                  rank 0 of the job using the folder holds a flock on it

Only rank 0 touches the file system, and only one job at a time (see ``lock``). A save
writes into a temporary folder, fsyncs every file and the folder, renames it into place and fsyncs
the root, so a crash at any point leaves either the old set of checkpoints or the new one, never a
half-written checkpoint under a ``ckpt-`` name. Saving a step that exists already never retires its
old copy before the new one is in place (see ``folder.place``). The outcome is broadcast, so when rank 0
fails every rank raises the same CheckpointError.
Loading walks the checkpoints newest first, verifies each manifest (sizes and checksums), skips and
reports the ones that fail, and broadcasts the first good state to every rank.
"""

from __future__ import annotations

import json
import os
import shutil
import time
import uuid
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .. import env as _env
from ..errors import CheckpointError, ConfigError
from ..log import get_logger
from ..preemption import report_to_launcher
from . import lock as checkpoint_lock
from . import manifest as _manifest
from .background import DEFAULT_WRITER_PRIORITY, BackgroundWrites, writer_nice
from .folder import (
    MANIFEST,
    delete_later,
    fsync_path,
    listing,
    place,
    signature,
    sync_and_hash,
    verify,
    wait_for_deletions,
)

if TYPE_CHECKING:
    from ..comm import Communicator

__all__ = ["CheckpointStore", "CheckpointInfo", "Resumed", "MANIFEST", "verify"]

_PREFIX = "ckpt-"
_TMP = ".tmp-"
_log = get_logger("checkpoint")


@dataclass(frozen=True)
class Position:
    """Where a checkpoint stands: steps and epochs completed, and the world size of the job that wrote it."""

    step: int
    epoch: int
    world_size: int


@dataclass(frozen=True)
class CheckpointInfo(Position):
    """A complete, verified checkpoint (its folder and manifest)."""

    path: str
    manifest: dict


@dataclass(frozen=True)
class Resumed(Position):
    """What a framework adapter's ``restore()`` brought back (``epoch``: epochs completed)."""

    extra: object
    path: str


def _version():
    from ... import __version__

    return __version__


class CheckpointStore:
    """Rank-0 checkpoints under ``root``, shared by the framework adapters.

    Collective: the constructor, ``save`` and ``load`` must be called by every rank. The
    constructor checks on rank 0 that ``root`` can be created and written and takes the folder's
    lock (held until ``close``, the store's garbage collection or the process's exit), so a bad
    path, or a folder in use by another job, fails on every rank before any training happens.
    ``writer_priority`` ("normal", "low" or "idle"; "auto" is chosen by the checkpointer): the scheduling
    priority of background writes (see ``hvdkit.core.checkpoint.background``).
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        comm: Communicator,
        keep: int = 3,
        framework: str = "none",
        writer_priority: str = DEFAULT_WRITER_PRIORITY,
    ) -> None:
        if not isinstance(keep, int) or keep < 1:
            raise ConfigError(f"keep must be an integer >= 1 (got {keep!r}): how many checkpoints to keep")
        writer_nice(writer_priority)  # a bad name fails before anything is made
        self.root = os.path.abspath(os.fspath(root))
        self.comm = comm
        self.keep = keep
        self.framework = framework
        self._lock = self._finalizer = None
        self._verified = {}  # path -> signature() of a checkpoint known to verify (rank 0)
        self._deferred = False  # the folder's check and lock wait for rank 0's first restore or save
        self._writes = BackgroundWrites(comm, self.root, writer_priority)  # the write of a background save, in flight
        if os.environ.get(_env.RECOVERY) == "in-process":
            # no collective here: a worker that joins builds its store while the others wait in the elastic
            # sync; rank 0 checks and locks the folder at the first restore or save (_become_rank0)
            self._deferred = True
            return
        error = self._preflight() if comm.is_rank0 else None
        error = comm.broadcast_object(error, name="hvdkit.checkpoint.preflight")
        if error:
            self.close()
            raise CheckpointError(error)

    def _preflight(self):
        """Rank 0: create the folder, lock it, sweep what dead jobs left; an error message or None."""
        try:
            os.makedirs(self.root, exist_ok=True)
            self._lock = checkpoint_lock.acquire(self.root)
            self._finalizer = weakref.finalize(self, checkpoint_lock.release, self._lock)
            probe = self._tmp_path("probe")
            with open(probe, "w") as f:
                f.write("ok")
            os.remove(probe)
        except CheckpointError as e:
            return str(e)
        except OSError as e:
            return (
                f"checkpoint directory {self.root!r} is not writable ({e.strerror or e}); "
                "pass a directory rank 0 can create and write (--checkpoint-dir)"
            )
        if self._lock.locked:
            self._sweep_dead_jobs()
        return None

    def _step_down(self):
        """A process that took the folder's lock as rank 0 and is another rank now (in-process recovery: a worker
        that joined was given rank 0) gives the lock back, after its own write in flight, so that the new rank 0
        can take it (it waits for it: ``lock.acquire``). No collective; nothing when this process holds no lock or
        is rank 0."""
        if self._lock is None or self.comm.is_rank0:
            return
        self._writes.join_locally()
        rank = self.comm.rank
        if self._finalizer is not None:
            self._finalizer()
        self._lock = self._finalizer = None
        self._deferred = True
        _log.info("this process is rank %d now, no longer rank 0: it gave back the lock on %s", rank, self.root)

    def _become_rank0(self):
        """A rank that is rank 0 now but was not when the store was built (in-process recovery after rank 0
        was lost: ``hvdkit.torch.elastic``) takes the folder's lock first; CheckpointError when it cannot."""
        if self._lock is None:
            error = self._preflight()
            if error:
                raise CheckpointError(error)
            if not self._deferred:  # deferred: maybe this process's first use as rank 0, maybe a take-over
                _log.info("rank 0 is this process now: it holds %s and writes the checkpoints", self.root)
            self._deferred = False

    def close(self) -> None:
        """Release the folder's lock (rank 0; no collective). The store must not be used after.

        A background write still in flight is finished first (its failure is logged on rank 0).
        """
        writes = getattr(self, "_writes", None)
        if writes is not None:
            writes.finish_locally(when="at close")
        finalizer = getattr(self, "_finalizer", None)
        if finalizer is not None:
            finalizer()

    def _tmp_path(self, kind):
        """A fresh temporary name carrying this job's id: ``.tmp-<job>-<kind>-<random>``."""
        return os.path.join(self.root, f"{_TMP}{self._lock.job}-{kind}-{uuid.uuid4().hex[:8]}")

    def _sweep_dead_jobs(self):
        """Delete the temporary entries of earlier jobs (rank 0, holding the lock).

        Every writer holds the folder's lock, so while this job holds it any other job's ``.tmp-``
        entry is what a job that died left behind (a write or a deletion cut short).
        """
        mine = f"{_TMP}{self._lock.job}-"
        try:
            dead = [n for n in os.listdir(self.root) if n.startswith(_TMP) and not n.startswith(mine)]
            if dead:
                _log.info(
                    "removing %d leftover(s) of earlier jobs under %s: %s",
                    len(dead),
                    self.root,
                    ", ".join(sorted(dead)),
                )
                self._delete([os.path.join(self.root, n) for n in dead])
        except OSError as e:  # only disk space is at stake: the job can go on
            _log.warning("could not remove the leftovers of earlier jobs under %s: %s", self.root, e)

    # ---------------------------------------------------------------- listing (rank 0)
    def candidates(self) -> list[tuple[int, str]]:
        """``(step, path)`` of every ``ckpt-`` folder, newest first, unverified.

        Copies of one step (``ckpt-S.N``, left by a save of step S again that was cut short) come
        newest generation first, then the plain ``ckpt-S``.
        """
        return [(step, path) for step, _, path in self._listing()]

    def _listing(self):
        return listing(self.root)

    def latest(self) -> CheckpointInfo | None:
        """The newest checkpoint that verifies (rank 0 only; no collective), or None.

        Checkpoints that fail verification are reported and skipped.
        """
        for _, path in self.candidates():
            try:
                m = verify(path)
            except CheckpointError as e:
                _log.warning("skipping checkpoint: %s; falling back to an older one", e)
                continue
            return CheckpointInfo(int(m["step"]), int(m["epoch"]), int(m["world_size"]), path, m)
        return None

    # ---------------------------------------------------------------- save
    def save(
        self,
        write: Callable[[str], object],
        step: int,
        epoch: int,
        meta: dict[str, Any] | Callable[[], dict[str, Any]] | None = None,
        check: Callable[[], object] | None = None,
        background: bool = False,
        copy: Callable[[], object] | None = None,
    ) -> str:
        """Write a checkpoint of ``step`` on rank 0; ``write(folder)`` puts the files in ``folder``.

        ``write`` may return ``{file name: SHA-256 hex}`` for files it hashed while writing them;
        every other file is hashed after it is written (either way the manifest holds every file's
        size and SHA-256, and every file is fsynced).

        ``meta`` goes into the manifest: a JSON-ready dict, or a function returning one (called on
        rank 0 after ``check``). ``check()``, if given, runs on rank 0 before anything is written; a
        ConfigError it raises (data that could not be read back, say) is raised on every rank as ConfigError. Returns
        the checkpoint's path on every rank. Raises CheckpointError on every rank when rank 0
        could not write it; earlier checkpoints are then left untouched.

        With ``background``, ``write`` (and ``meta``, when a function) run in a thread of rank 0
        after ``check`` returned: ``check`` must leave everything ``write`` reads in memory of its
        own (a copy of the state), since training goes on meanwhile. The save then returns the path
        the checkpoint will have once written, and a failure of the write is raised on every rank
        by the next ``save``, ``wait`` or ``load``. Every save first waits for the write in flight
        (at most one at a time) and raises its failure, before anything else. ``copy``, with
        ``background``: run by that thread first, at training's priority (the part of the copy of the
        state that ``check`` left to it); until it returns, ``wait_copied`` and
        ``background.wait_for_copies`` wait, so whatever changes that state in place must call one first.
        Collective: every rank calls it; only rank 0 calls ``check`` and ``write``.
        """
        self._step_down()
        self._writes.settle(next_step=int(step))
        # Read here, not in the write thread: under --recovery in-process a reset shuts Horovod down (its
        # rank() and size() raise) while a background write may still be in flight.
        world_size = self.comm.size
        result = None
        if self.comm.is_rank0:
            try:
                self._become_rank0()
                if check is not None:
                    check()
                if background:
                    result = ("started", os.path.join(self.root, f"{_PREFIX}{int(step):012d}"))
                else:
                    result = ("ok", self._write(write, int(step), int(epoch), world_size, meta or {}))
            except ConfigError as e:
                result = ("invalid", f"the checkpoint of step {step} was not saved: {e}")
            except Exception as e:  # noqa: BLE001 - any failure must reach every rank
                result = ("error", f"saving the checkpoint of step {step} to {self.root!r} failed: {e}")
        status, value = self.comm.broadcast_object(result, name="hvdkit.checkpoint.save")
        if status == "invalid":
            raise ConfigError(value)
        if status == "started":
            self._writes.start(
                int(step), lambda: self._write(write, int(step), int(epoch), world_size, meta or {}), copy
            )
        elif status != "ok":
            raise CheckpointError(value)
        return value

    def settle_locally(self) -> None:
        """``BackgroundWrites.settle_locally``: after an in-process recovery or join, no collective. A process that
        was rank 0 before and is not now also gives back the folder's lock here."""
        self._writes.settle_locally()
        self._step_down()

    def wait_copied(self) -> None:
        """Wait until the background save in flight has its copy of the state (rank 0; no collective)."""
        self._writes.wait_copied()

    @property
    def copying(self) -> bool:
        """Whether the background save in flight is still copying the state (rank 0; no collective)."""
        return self._writes.copying

    @property
    def writing(self) -> bool:
        """Whether a background write is running now (rank 0; False on the other ranks; no collective)."""
        return self._writes.running

    def wait(self) -> str | None:
        """Wait for the background write in flight: its checkpoint's path, or None when none was in flight.

        Raises CheckpointError on every rank when that write failed on rank 0 (naming its step and
        the cause). Collective: every rank calls it (it communicates only when a background save
        was made since the last ``save``, ``wait`` or ``load``).
        """
        return self._writes.settle()

    def _write(self, write, step, epoch, world_size, meta):
        """Rank 0, in the caller's thread or the write thread: no collective, no call to the communicator."""
        t0 = time.perf_counter()
        self.wait_for_cleanup()  # the previous save's deletions (normally long done)
        tmp = self._tmp_path(f"{_PREFIX}{step:012d}")
        os.makedirs(tmp)
        try:
            meta = meta() if callable(meta) else meta
            hashed = write(tmp)
            files = sync_and_hash(tmp, hashed if isinstance(hashed, dict) else None)
            manifest = _manifest.seal(
                {
                    "step": step,
                    "epoch": epoch,
                    "world_size": world_size,
                    "framework": self.framework,
                    "hvdkit_version": _version(),
                    "created": time.time(),
                    "files": files,
                    "meta": meta,
                }
            )
            mpath = os.path.join(tmp, MANIFEST)
            with open(mpath, "w", encoding="utf-8") as f:
                json.dump(manifest, f, indent=1, sort_keys=True)
                f.flush()
                os.fsync(f.fileno())
            fsync_path(tmp, directory=True)
            final = os.path.join(self.root, f"{_PREFIX}{step:012d}")
            older = [(gen, path) for s, gen, path in self._listing() if s == step]  # saved again
            final = place(tmp, final, older, lambda: self._tmp_path("trash"))
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        self._verified[final] = signature(final)  # written and hashed just now
        self._prune(keep_path=final)
        _log.info("saved checkpoint step %d epoch %d in %.3f s: %s", step, epoch, time.perf_counter() - t0, final)
        # An elastic launcher compares it with the step the next attempt resumes at (a folder the
        # hosts do not share shows as a resume below it).
        report_to_launcher({"event": "saved", "step": step})
        return final

    def _prune(self, keep_path):
        """Keep the newest ``keep`` checkpoints that verify; remove the rest and this job's leftovers.

        A checkpoint that fails verification does not count toward ``keep`` (it would crowd out a
        good one) and is removed. Checkpoints this store wrote or verified before are not hashed
        again. Only this job's ``.tmp-`` entries are swept; other jobs' are left alone.
        What goes is first renamed out of the ``ckpt-`` namespace (instant: the listing is right
        when ``save`` returns), then deleted by a background thread, so freeing a large checkpoint's
        disk blocks does not hold up training. The thread is not a daemon: a process waits for
        it before exiting. A process killed mid-deletion leaves a ``.tmp-`` entry that the next
        job to take the folder's lock removes.
        """
        kept, doomed = 0, []
        for _, path in self.candidates():
            if path == keep_path or (kept < self.keep and self._verifies(path)):
                kept += 1
            else:
                doomed.append(path)
        mine = f"{_TMP}{self._lock.job}-"
        self._delete(doomed + [os.path.join(self.root, n) for n in os.listdir(self.root) if n.startswith(mine)])

    def _verifies(self, path):
        """Whether the checkpoint ``path`` verifies (hashed once per store, unless it changes)."""
        now = signature(path)
        if now is not None and self._verified.get(path) == now:
            return True
        try:
            verify(path)
        except CheckpointError as e:
            _log.warning(
                "removing a checkpoint that fails verification (it does not count toward keep=%d): %s", self.keep, e
            )
            return False
        self._verified[path] = now
        return True

    def _delete(self, paths):
        """Take ``paths`` out of the way now; a background thread deletes them (see _prune)."""
        trash = f"{_TMP}{self._lock.job}-trash-"
        delete_later(self.root, paths, lambda: self._tmp_path("trash"), lambda name: name.startswith(trash))

    def wait_for_cleanup(self) -> None:
        """Block until pruned checkpoints under this root are deleted (rank 0; no collective)."""
        wait_for_deletions(self.root)

    # ---------------------------------------------------------------- load
    def load(self, read: Callable[[str], Any]) -> tuple[Any, CheckpointInfo] | None:
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

    def load_on_rank0(
        self, read: Callable[[str], Any], describe: Callable[[Any, CheckpointInfo], Any] | None = None
    ) -> tuple[Any, Any, CheckpointInfo] | None:
        """Read the newest good checkpoint on rank 0 and tell every rank which one it is.

        Rank 0 walks the checkpoints newest first and calls ``read(folder)`` on the first that
        verifies; a checkpoint that fails verification or ``read`` is reported and skipped. Then
        rank 0 calls ``describe(state, info)`` (if given): its result, the header, must be small,
        since it is broadcast with the outcome. Returns ``(state, header, info)`` on rank 0,
        ``(None, header, info)`` on the other ranks, None on every rank when there is no
        checkpoint. Any failure on rank 0 (the folder cannot be listed, no checkpoint loads,
        ``describe`` raises) raises CheckpointError on every rank, so no rank waits for another.
        A background write in flight is waited for first (see ``wait``).
        Collective: every rank calls it; only rank 0 touches the file system.
        """
        self._step_down()
        self.wait()
        outcome, state = None, None
        if self.comm.is_rank0:
            try:
                self._become_rank0()
                outcome, state = self._open_newest(read, describe)
            except CheckpointError as e:
                outcome = ("error", str(e))
            except Exception as e:  # noqa: BLE001 - any failure must reach every rank
                outcome = (
                    "error",
                    f"reading the checkpoints under {self.root!r} failed on rank 0 ({type(e).__name__}: {e}); "
                    "pass a checkpoint directory that rank 0 can list and read (--checkpoint-dir)",
                )
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
            return state, CheckpointInfo(int(m["step"]), int(m["epoch"]), int(m["world_size"]), path, m)
        if skipped:
            raise CheckpointError(f"no checkpoint under {self.root!r} could be loaded; skipped: {', '.join(skipped)}")
        return None
