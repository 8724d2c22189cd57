"""The arrays file written with O_DIRECT: the same bytes as through the page cache, and the fallbacks where it is refused."""

import errno
import fcntl
import hashlib
import logging
import os

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import hvdkit.core.checkpoint.direct as direct_module
from hvdkit.core.checkpoint.arrays import ArrayFile, write_arrays

SMALL_BUFFER = 3 * direct_module._ALIGN  # many buffers, so the writer also waits for the disk thread


def _items():
    """Arrays whose sizes are not multiples of the block: the file ends in a partial block."""
    return [
        ("model/0", np.arange(25_001, dtype=np.float64)),  # 200,008 bytes
        ("model/1", np.float32(3.5).reshape(())),
        ("empty", np.zeros((0, 4), np.int8)),
        ("rng/0/1", np.arange(7, dtype=np.uint32)),
    ]


def _check(path, digest, items):
    data = path.read_bytes()
    assert digest == hashlib.sha256(data).hexdigest()
    arrays = ArrayFile(path)
    assert arrays.names() == [n for n, _ in items]
    with np.load(path) as loaded:  # numpy checks each member's CRC
        for name, want in items:
            for got in (arrays.read(name), loaded[name]):
                assert (got.shape, got.dtype) == (want.shape, want.dtype), name
                assert got.tobytes() == want.tobytes(), name
    return data


@pytest.fixture
def pwrites(monkeypatch):
    """Every ``os.pwrite`` of the disk thread: (with O_DIRECT, file offset, bytes)."""
    calls, real = [], os.pwrite

    def pwrite(fd, data, offset):
        calls.append((bool(fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_DIRECT), offset, len(memoryview(data))))
        return real(fd, data, offset)

    monkeypatch.setattr(direct_module.os, "pwrite", pwrite)
    return calls


@pytest.fixture
def refusal_untold(monkeypatch):
    """The "O_DIRECT refused" debug line as if not yet logged in this process."""
    monkeypatch.setattr(direct_module, "_refusal_told", direct_module.threading.Event())


def _takes_o_direct(folder):
    probe = direct_module.open_direct(folder / "probe")
    if probe is None:
        return False
    probe.close()
    os.remove(folder / "probe")
    return True


def test_a_file_written_with_o_direct_has_the_same_bytes_in_whole_aligned_blocks_then_a_buffered_tail(
    tmp_path, monkeypatch, pwrites
):
    if not _takes_o_direct(tmp_path):
        pytest.skip(f"the file system of {tmp_path} refuses O_DIRECT")
    monkeypatch.setattr(direct_module, "_BUFFER", SMALL_BUFFER)
    items = _items()
    plain = _check(tmp_path / "plain.npz", write_arrays(tmp_path / "plain.npz", items), items)
    pwrites.clear()
    direct = _check(tmp_path / "direct.npz", write_arrays(tmp_path / "direct.npz", items, direct=True), items)
    assert direct == plain
    *blocks, tail = pwrites
    assert len(blocks) > 10  # 200 KB in 12 KiB buffers
    assert all(with_direct and n % 4096 == 0 for with_direct, _, n in blocks)
    assert [offset for _, offset, _ in blocks] == [sum(n for _, _, n in blocks[:i]) for i in range(len(blocks))]
    end = sum(n for _, _, n in blocks)
    assert tail == (False, end, len(plain) - end)  # the partial block at the end, without O_DIRECT
    assert 0 < tail[2] < 4096


def test_where_the_file_system_refuses_o_direct_the_file_goes_through_the_page_cache_and_the_log_says_so_once(
    tmp_path, monkeypatch, caplog, refusal_untold
):
    real_open = os.open

    def tmpfs_like_open(path, flags, mode=0o777):
        if flags & os.O_DIRECT:
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_open(path, flags, mode)

    monkeypatch.setattr(direct_module.os, "open", tmpfs_like_open)
    items = _items()
    with caplog.at_level(logging.DEBUG, logger="hvdkit.checkpoint"):
        first = _check(tmp_path / "a.npz", write_arrays(tmp_path / "a.npz", items, direct=True), items)
        second = _check(tmp_path / "b.npz", write_arrays(tmp_path / "b.npz", items, direct=True), items)
    assert first == second
    said = [r for r in caplog.records if "O_DIRECT refused" in r.getMessage()]
    assert len(said) == 1 and said[0].levelno == logging.DEBUG
    assert "a.npz" in said[0].getMessage() and "page cache" in said[0].getMessage()


def test_an_open_error_other_than_a_refusal_of_o_direct_is_raised_as_it_is(tmp_path):
    with pytest.raises(FileNotFoundError):
        write_arrays(tmp_path / "missing" / "a.npz", _items(), direct=True)


def test_a_write_refused_with_o_direct_goes_on_through_the_page_cache_and_the_bytes_are_the_same(
    tmp_path, monkeypatch, pwrites, refusal_untold, caplog
):
    if not _takes_o_direct(tmp_path):
        pytest.skip(f"the file system of {tmp_path} refuses O_DIRECT")
    monkeypatch.setattr(direct_module, "_BUFFER", SMALL_BUFFER)
    recording = direct_module.os.pwrite

    def refuses_the_third(fd, data, offset):
        if len(pwrites) == 2 and fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_DIRECT:
            pwrites.append("refused")
            raise OSError(errno.EINVAL, "Invalid argument")
        return recording(fd, data, offset)

    monkeypatch.setattr(direct_module.os, "pwrite", refuses_the_third)
    items = _items()
    with caplog.at_level(logging.DEBUG, logger="hvdkit.checkpoint"):
        got = _check(tmp_path / "a.npz", write_arrays(tmp_path / "a.npz", items, direct=True), items)
    assert got == _check(tmp_path / "b.npz", write_arrays(tmp_path / "b.npz", items), items)
    assert pwrites[:2] == [(True, 0, SMALL_BUFFER), (True, SMALL_BUFFER, SMALL_BUFFER)]
    assert pwrites[2] == "refused"
    assert pwrites[3][:2] == (False, 2 * SMALL_BUFFER)  # the same buffer again, through the page cache
    assert all(not with_direct for with_direct, _, _ in pwrites[3:])
    assert sum("O_DIRECT refused" in r.getMessage() for r in caplog.records) == 1


def test_a_disk_error_in_the_disk_thread_fails_the_write_without_hanging(tmp_path, monkeypatch):
    monkeypatch.setattr(direct_module, "_BUFFER", SMALL_BUFFER)

    def full_disk(fd, data, offset):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(direct_module.os, "pwrite", full_disk)
    with pytest.raises(OSError, match="No space left on device"):
        write_arrays(tmp_path / "a.npz", _items(), direct=True)


@st.composite
def _arrays(draw):
    return draw(
        hnp.arrays(
            st.sampled_from(["float64", "float32", "int8", "bool", "complex64"]),
            hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=40),
        )
    )


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(_arrays(), max_size=4))
def test_any_arrays_written_with_o_direct_give_the_same_file_as_through_the_page_cache(tmp_path, items):
    named = [(f"tree/{i}", a) for i, a in enumerate(items)]
    before = direct_module._BUFFER
    direct_module._BUFFER = direct_module._ALIGN  # every block boundary lands somewhere in these small files
    try:
        digest = write_arrays(tmp_path / "direct.npz", named, direct=True)
    finally:
        direct_module._BUFFER = before
    assert _check(tmp_path / "direct.npz", digest, named) == _check(
        tmp_path / "plain.npz", write_arrays(tmp_path / "plain.npz", named), named
    )
