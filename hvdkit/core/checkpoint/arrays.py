"""A checkpoint's arrays in one file: written one array at a time, read back one at a time.

The file is an uncompressed ``.npz`` (a zip of ``.npy`` members, ``numpy.load`` reads it). The writer
streams each array into its member straight from the array's memory, so a save holds no second copy
of the state. While it writes, one thread computes the file's SHA-256 from the same memory and
another starts the disk writes (``fdatasync``) of what is written so far, so a save costs about the
write alone instead of write + hash + fsync in turn. With ``direct`` the bytes bypass the page
cache (``O_DIRECT``, see ``direct``; the file's bytes are the same). The reader maps each member's
data into memory (copy-on-write): nothing is read from disk before it is used.
"""

from __future__ import annotations

import hashlib
import io
import os
import queue
import struct
import threading
import zipfile
from collections.abc import Iterable
from typing import Any

import numpy as np

from ..errors import CheckpointError
from .direct import open_direct

__all__ = ["ARRAYS", "write_arrays", "ArrayFile"]

ARRAYS = "arrays.npz"
_LOCAL_HEADER = struct.Struct("<4s5H3L2H")  # a zip member's local file header (30 bytes)
# An array's data reaches the zip (CRC), the file and the hash in pieces this size, and the hash thread
# is at most _HASH_LAG pieces behind the writes: each piece is then read from memory once and found in
# the cores' caches by the CRC, the copy into the page cache and the hash. With 4 MiB pieces and no bound
# each of the three read it from memory: 1.4-2.0 s of CPU per GiB written against 1.0 (2 cores, shared).
_CHUNK = 256 << 10
_HASH_LAG = 8
_SYNC_EVERY = 16 << 20  # start the disk write of what is written after each this many bytes


def write_arrays(path: str, items: Iterable[tuple[str, Any]], direct: bool = False) -> str:
    """Write ``(name, array)`` pairs to the ``.npz`` file ``path``, one at a time; its SHA-256 (hex).

    ``items`` may be a generator: each array is converted and written before the next is asked
    for, so only one is held at a time. Object arrays are refused (they would need pickle).
    The digest is of the file's bytes, computed while they are written (nothing is read back).
    The file is not yet durable: fsync it (the disk writes have already begun). ``direct``: write it
    with ``O_DIRECT`` (not through the page cache) where the file system takes it, else as usual.
    """
    with _HashingSink(path, direct) as sink:
        with zipfile.ZipFile(sink, "w", compression=zipfile.ZIP_STORED, allowZip64=True) as zf:
            for name, array in items:
                array = np.asarray(array)
                if array.dtype.hasobject:
                    raise CheckpointError(f"array {name!r} holds Python objects, which a checkpoint does not store")
                with zf.open(f"{name}.npy", "w", force_zip64=True) as f:
                    _write_npy(f, array)
                sink.drain()  # the hash thread is done with this array's memory
                del array  # before the next one is made
    return sink.hexdigest


class _HashingSink:
    """A file written front to back, hashed on the way by a helper thread.

    ``seek`` is refused, so ``zipfile`` writes each member's CRC and sizes after its data (a data
    descriptor) instead of going back to its header: the file's bytes are exactly the bytes
    written, in order, and their hash is the file's. ``write`` hands the hash thread the caller's
    buffer itself (no copy); the caller keeps it unchanged until ``drain`` or ``close`` returns.
    ``write`` waits while the hash thread is ``_HASH_LAG`` buffers behind (they are still in cache).
    The bytes reach the file through the page cache (``_SyncedFile``) or, with ``direct``, with
    ``O_DIRECT`` where the file system takes it (``direct.DirectFile``). ``close`` waits for the
    threads and raises what they met (a failed disk write, say).
    """

    def __init__(self, path, direct=False):
        self._file = open_direct(path) if direct else None  # None: O_DIRECT refused there
        if self._file is None:
            self._file = _SyncedFile(path)
        self._sha = hashlib.sha256()
        self._size = 0
        self._chunks = queue.Queue(maxsize=_HASH_LAG)  # write() waits when the hash is this far behind
        self.hexdigest = None
        self._hasher = threading.Thread(target=self._hash_loop, name="hvdkit-ckpt-sha256", daemon=True)
        self._hasher.start()

    def write(self, data):
        view = memoryview(data).cast("B")
        self._file.write(view)
        self._chunks.put(view)
        self._size += len(view)
        return len(view)

    def tell(self):
        return self._size

    def seek(self, *args):
        raise io.UnsupportedOperation("written front to back")

    def flush(self):
        pass  # unbuffered

    def drain(self):
        """Wait until every buffer written so far is hashed (the caller may then change or free it)."""
        self._chunks.join()

    def _hash_loop(self):
        while (view := self._chunks.get()) is not None:
            self._sha.update(view)  # releases the GIL for large buffers
            del view  # holding it while waiting would keep the caller's last array alive
            self._chunks.task_done()

    def close(self):
        self._chunks.put(None)
        try:
            self._file.close()
        finally:
            self._hasher.join()
        self.hexdigest = self._sha.hexdigest()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class _SyncedFile:
    """A file written through the page cache whose disk writes a helper thread starts on the way (``fdatasync``).

    After every ``_SYNC_EVERY`` bytes written the thread is asked to ``fdatasync``, so the disk
    writes overlap the rest of the write instead of all waiting for the final fsync. ``close``
    waits for the thread and raises what it met (a failed ``fdatasync``, say).
    """

    def __init__(self, path):
        self._file = open(path, "wb", buffering=0)  # noqa: SIM115 - closed in close()
        self._unsynced = 0
        self._errors = []
        self._sync_wanted = threading.Event()
        self._sync_asked = False
        self._done = False
        self._thread = threading.Thread(target=self._sync_loop, name="hvdkit-ckpt-sync", daemon=True)
        self._thread.start()

    def write(self, view):
        written = 0
        while written < len(view):  # a raw file may take fewer bytes than given
            written += self._file.write(view[written:])
        self._unsynced += len(view)
        if self._unsynced >= _SYNC_EVERY:
            self._unsynced = 0
            self._sync_asked = True
            self._sync_wanted.set()

    def _sync_loop(self):
        while True:
            self._sync_wanted.wait()
            self._sync_wanted.clear()
            if self._sync_asked:  # every request is served, even one made just before close
                self._sync_asked = False
                try:
                    os.fdatasync(self._file.fileno())
                except OSError as e:
                    self._errors.append(e)
                    return
            if self._done:
                return

    def close(self):
        self._done = True
        self._sync_wanted.set()
        self._thread.join()
        self._file.close()
        if self._errors:
            raise self._errors[0]


def _write_npy(f, array):
    """``array`` in ``.npy`` format to the zip member ``f``, its data written straight from its memory.

    ``numpy.lib.format.write_array`` copies a non-file target's data through fresh 16 MiB ``bytes``
    chunks; here the zip member gets one view of the array (its CRC is computed over the same view):
    a 64 MB checkpoint save went from 80 to 74 ms. A non-C-contiguous array is made contiguous first
    (one copy of that array only).
    """
    if not array.flags.c_contiguous:  # (not np.ascontiguousarray always: it makes a 0-d array 1-d)
        array = np.ascontiguousarray(array)
    header = np.lib.format.header_data_from_array_1_0(array)
    try:
        np.lib.format.write_array_header_1_0(f, header)
    except ValueError:  # a header over 64 KiB (a very long shape): format 2.0 allows 4 GiB
        np.lib.format.write_array_header_2_0(f, header)
    if array.size:
        data = memoryview(array).cast("B")
        for start in range(0, len(data), _CHUNK):  # CRC, write and hash of neighbouring pieces overlap
            f.write(data[start : start + _CHUNK])


class ArrayFile:
    """The arrays of a ``.npz`` file written by ``write_arrays`` (or ``numpy.savez``), by name."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._members = {}  # name -> (shape, dtype, fortran, data offset) or None when compressed
        with zipfile.ZipFile(path) as zf, open(path, "rb") as raw:
            for info in zf.infolist():
                name = info.filename.removesuffix(".npy")
                self._members[name] = self._locate(zf, raw, info)

    def _locate(self, zf, raw, info):
        with zf.open(info) as f:
            shape, fortran, dtype = _read_header(f, self.path, info.filename)
        if info.compress_type != zipfile.ZIP_STORED:
            return shape, dtype, fortran, None
        raw.seek(info.header_offset)
        fields = _LOCAL_HEADER.unpack(raw.read(_LOCAL_HEADER.size))
        start = info.header_offset + _LOCAL_HEADER.size + fields[-2] + fields[-1]
        raw.seek(start)
        _read_header(raw, self.path, info.filename)
        return shape, dtype, fortran, raw.tell()

    def names(self) -> list[str]:
        """The names of the arrays, in the order they were written."""
        return list(self._members)

    def spec(self, name: str) -> tuple[tuple[int, ...], np.dtype]:
        """``(shape, dtype)`` of the array ``name``, read from its header."""
        shape, dtype, _, _ = self._member(name)
        return shape, dtype

    def read(self, name: str, copy: bool = False) -> np.ndarray:
        """The array ``name``: mapped from the file (copy-on-write), or with ``copy`` read into memory."""
        shape, dtype, fortran, offset = self._member(name)
        order = "F" if fortran else "C"
        if offset is None:
            with zipfile.ZipFile(self.path) as zf, zf.open(f"{name}.npy") as f:
                return np.lib.format.read_array(f, allow_pickle=False)
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        if offset + nbytes > os.path.getsize(self.path):
            raise CheckpointError(f"{self.path}: array {name!r} runs past the end of the file")
        if nbytes == 0:
            return np.empty(shape, dtype, order=order)
        mapped = np.memmap(self.path, dtype=dtype, mode="c", offset=offset, shape=shape, order=order)
        return np.array(mapped) if copy else mapped

    def _member(self, name):
        try:
            return self._members[name]
        except KeyError:
            raise CheckpointError(f"{self.path} holds no array {name!r}") from None


def _read_header(f, path, member):
    try:
        version = np.lib.format.read_magic(f)
        read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
        shape, fortran, dtype = read(f)
    except ValueError as e:
        raise CheckpointError(f"{path}: {member} is not a NumPy array ({e})") from None
    if dtype.hasobject:
        raise CheckpointError(f"{path}: {member} holds Python objects, which are not loaded")
    return tuple(shape), fortran, dtype
