"""The arrays file's SHA-256 thread stays a few pieces behind the writes (the pieces are still in cache)."""

import hashlib
import threading
import time

import numpy as np

import hvdkit.core.checkpoint.arrays as arrays_module
from hvdkit.core.checkpoint.arrays import ArrayFile, write_arrays


class _SlowSha:
    """SHA-256 that takes 2 ms a piece and counts the bytes it has taken (the hash thread calls it)."""

    def __init__(self):
        self.sha, self.hashed, self.lock = hashlib.sha256(), 0, threading.Lock()

    def update(self, view):
        time.sleep(0.002)
        self.sha.update(view)
        with self.lock:
            self.hashed += len(view)

    def hexdigest(self):
        return self.sha.hexdigest()


class _LagSink(arrays_module._HashingSink):
    """The sink ``write_arrays`` uses, recording after each write how many written bytes are not yet hashed."""

    lags: list[int] = []

    def __init__(self, path, *args):  # args: how the file is written (direct or not), passed on
        super().__init__(path, *args)
        self._sha = _SlowSha()  # the hash thread waits for the first piece: nothing is hashed yet

    def write(self, data):
        n = super().write(data)
        with self._sha.lock:
            type(self).lags.append(self._size - self._sha.hashed)
        return n


def test_the_hash_thread_is_never_more_than_a_few_pieces_behind_the_writes_and_the_file_is_unchanged(
    tmp_path, monkeypatch
):
    monkeypatch.setattr(arrays_module, "_CHUNK", 1000)
    monkeypatch.setattr(arrays_module, "_HashingSink", _LagSink)
    _LagSink.lags = []
    big = np.arange(25_001, dtype=np.float64)  # 200,008 bytes: 201 pieces, the last one partial
    digest = write_arrays(tmp_path / "a.npz", [("big", big), ("small", np.ones(3))])
    data = (tmp_path / "a.npz").read_bytes()
    assert digest == hashlib.sha256(data).hexdigest()
    assert np.array_equal(ArrayFile(tmp_path / "a.npz").read("big"), big)
    assert np.array_equal(np.load(tmp_path / "a.npz")["big"], big)  # numpy checks each member's CRC
    # the queue holds at most 8 pieces and the hash thread one more: at most 9,000 bytes behind
    # (without the bound, the writes ran ahead by nearly the whole array)
    assert len(_LagSink.lags) > 200
    assert max(_LagSink.lags) <= 9_000, max(_LagSink.lags)
