"""A file written front to back with ``O_DIRECT``: from a few reused aligned buffers to the disk, not the page cache.

A buffered ``write()`` copies every byte into freshly allocated page-cache pages (kernel work: the
pages, their dirty accounting, the file system's delayed allocation) and leaves taking them to
disk to the kernel's writeback, part of which runs in kernel threads at normal priority whatever
the writer's own priority; 1 GiB of new pages also passes through the cores' shared cache. Here the
writer copies each piece into one of ``_BUFFERS`` page-aligned buffers of ``_BUFFER`` bytes that it
reuses (they stay in cache), and one thread hands each full buffer to the disk with ``O_DIRECT``
(the disk reads it from memory itself, in the thread that asked). The file's bytes are the same.

``O_DIRECT`` wants the buffer's address, the file offset and the length aligned to the device's
block (``_ALIGN`` = 4096 covers the usual 512 and 4096): the buffers are ``mmap``'d (page-aligned)
and every one is written whole, except the last one's tail, which is written after ``O_DIRECT`` is
cleared from the file (``fcntl``). Where ``O_DIRECT`` is refused (no such flag on the platform,
EINVAL at the open or at a write: tmpfs before Linux 6.6, some network and FUSE file systems) the
bytes go through the page cache as usual, and the log says so once, at debug level. As with a
buffered write, the file is durable only once fsynced (the checkpoint protocol does that).
"""

from __future__ import annotations

import errno
import fcntl
import mmap
import os
import queue
import threading

import numpy as np

from ..log import get_logger

__all__ = ["DirectFile", "open_direct"]

_log = get_logger("checkpoint")
_ALIGN = 4096  # the block O_DIRECT writes are aligned to (address, offset and length)
_BUFFER = 4 << 20  # a multiple of _ALIGN: every buffer but the last is written whole
_BUFFERS = 3  # the writer fills one while the disk takes the others
_refusal_told = threading.Event()  # "O_DIRECT refused" is logged once a process


def open_direct(path: str | os.PathLike[str]) -> DirectFile | None:
    """``path`` created (or truncated) for writing with ``O_DIRECT``; None where that is refused (logged once)."""
    flag = getattr(os, "O_DIRECT", 0)
    if not flag:
        _tell_refused(path, "this platform has no O_DIRECT")
        return None
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | flag, 0o666)
    except OSError as e:
        if e.errno != errno.EINVAL:  # a missing folder, no permission...: the same error a buffered open gives
            raise
        _tell_refused(path, e)
        return None
    return DirectFile(fd, os.fspath(path))


def _tell_refused(path, why):
    if not _refusal_told.is_set():
        _refusal_told.set()
        _log.debug("O_DIRECT refused for %s (%s): checkpoint files go through the page cache (said once)", path, why)


class DirectFile:
    """An open file written front to back with ``O_DIRECT`` (see the module doc); ``close`` raises what the disk met.

    ``write`` copies the caller's bytes before it returns (the caller may change them at once); it
    waits while every buffer is full and on its way to the disk. A write that failed in the thread
    (no space left, an I/O error) is raised by the next ``write`` and by ``close``.
    """

    def __init__(self, fd: int, path: str) -> None:
        self.path = path
        self._fd = fd
        self._direct = True  # until a write is refused, or the tail
        self._free = queue.SimpleQueue()  # buffers the writer may fill
        self._full = queue.SimpleQueue()  # (buffer, bytes, file offset) for the thread; None: no more
        self._made = 1
        self._buf = _new_buffer()
        self._fill = 0
        self._offset = 0  # where self._buf goes in the file
        self._errors = []
        self._thread = threading.Thread(target=self._disk_loop, name="hvdkit-ckpt-direct-io", daemon=True)
        self._thread.start()

    def write(self, data: bytes | bytearray | memoryview) -> int:
        """Copy ``data`` into the buffers (a full one goes to the disk); the number of bytes (all of them)."""
        src = np.frombuffer(data, dtype=np.uint8)
        done = 0
        while done < len(src):
            n = min(len(src) - done, _BUFFER - self._fill)
            self._buf[self._fill : self._fill + n] = src[done : done + n]  # numpy copies without the GIL
            self._fill += n
            done += n
            if self._fill == _BUFFER:
                self._hand_over()
        return len(src)

    def _hand_over(self):
        self._full.put((self._buf, self._fill, self._offset))
        self._offset += self._fill
        if self._free.empty() and self._made < _BUFFERS:
            self._made += 1
            self._buf = _new_buffer()
        else:
            self._buf = self._free.get()  # waits while the disk is _BUFFERS buffers behind
        self._fill = 0
        if self._errors:
            raise self._errors[0]

    def _disk_loop(self):
        while (job := self._full.get()) is not None:
            buf, length, offset = job
            if not self._errors:  # after a failure the buffers only come back (the writer may wait for one)
                try:
                    self._write_at(buf, length, offset)
                except OSError as e:
                    self._errors.append(e)
            self._free.put(buf)

    def _write_at(self, buf, length, offset):
        """``buf[:length]`` at ``offset``: its whole blocks with O_DIRECT, the rest (the file's tail) without."""
        whole = length - length % _ALIGN
        done = 0
        while done < length:
            if done >= whole and self._direct:
                self._stop_direct(None)
            try:
                done += os.pwrite(self._fd, buf[done : (whole if self._direct else length)], offset + done)
            except OSError as e:
                if e.errno != errno.EINVAL or not self._direct:
                    raise
                self._stop_direct(e)  # refused at a write (alignment, the file system): the page cache from here

    def _stop_direct(self, refused):
        flags = fcntl.fcntl(self._fd, fcntl.F_GETFL)
        fcntl.fcntl(self._fd, fcntl.F_SETFL, flags & ~os.O_DIRECT)
        self._direct = False
        if refused is not None:
            _tell_refused(self.path, refused)

    def close(self) -> None:
        """Write what is left, wait for the thread, close the file; raise the first error a write met."""
        try:
            if self._fill:
                self._full.put((self._buf, self._fill, self._offset))
                self._offset += self._fill
                self._fill = 0
            self._full.put(None)
            self._thread.join()
        finally:
            os.close(self._fd)
        if self._errors:
            raise self._errors[0]


def _new_buffer():
    """A page-aligned buffer of ``_BUFFER`` bytes (anonymous memory: pages are given on first use)."""
    return np.frombuffer(mmap.mmap(-1, _BUFFER), dtype=np.uint8)
