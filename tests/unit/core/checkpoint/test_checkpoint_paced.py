"""``writer_priority="paced"``: each thread of a background write keeps to a share of a core, until something waits.

The pacer is checked on a clock the test moves (no timing); the write through ``write_arrays`` and
``CheckpointStore`` on real threads, with a size-1 communicator.
"""

import hashlib
import threading

import numpy as np
import pytest

from hvdkit.core import ConfigError, LocalCommunicator
from hvdkit.core.checkpoint import CheckpointStore, arrays, background, pace
from hvdkit.core.checkpoint.arrays import ArrayFile, write_arrays

BOUND_S = 60  # a wait that never ends fails here instead of hanging the test


class Clock:
    """A thread's CPU clock that the test moves; it records the rests the pacer asked for."""

    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


class Hurry(threading.Event):
    """An event whose waits are recorded instead of slept (the pacer's rests), set or not as a real one."""

    def __init__(self):
        super().__init__()
        self.waits = []

    def wait(self, timeout=None):
        self.waits.append(timeout)
        return self.is_set()


@pytest.mark.parametrize("share", [0.02, 0.25, 0.5, 1.0])
def test_each_piece_of_work_is_followed_by_a_rest_that_makes_it_the_share_of_the_time(share):
    clock, hurry = Clock(), Hurry()
    pacer = pace.Pacer(share, hurry, clock)
    pacer.start()
    for work in (0.004, 0.001, 0.010):
        clock.now += work
        pacer.rest()
    works = [0.004, 0.001, 0.010]
    expected = [w * (1 - share) / share for w in works]
    assert hurry.waits == (pytest.approx(expected) if share < 1 else [])  # a whole core: no rest, no wait
    assert pacer.rested == pytest.approx(sum(expected))
    assert sum(works) / (sum(works) + pacer.rested) == pytest.approx(share)  # the share of the time worked


def test_once_hurried_a_pacer_rests_no_more_and_a_rest_in_progress_ends():
    clock, hurry = Clock(), Hurry()
    pacer = pace.Pacer(0.1, hurry, clock)
    pacer.start()
    clock.now += 0.01
    pacer.rest()
    hurry.set()
    clock.now += 0.01
    pacer.rest()
    assert hurry.waits == [pytest.approx(0.09)]
    real = threading.Event()
    sleeper = pace.Pacer(1e-6, real)  # a rest of about a day per ms of work, unless hurried
    sleeper.start()
    sum(range(200_000))  # some CPU work of this thread
    threading.Timer(0.05, real.set).start()
    done = threading.Event()
    threading.Thread(target=lambda: (sleeper.rest(), done.set()), daemon=True).start()
    assert done.wait(BOUND_S)


@pytest.mark.parametrize("share", [0.0, -0.1, 1.5])
def test_a_share_outside_0_to_1_is_refused_naming_it(share):
    with pytest.raises(ValueError, match=rf"\(0, 1\] \(got {share!r}\)"):
        pace.Pacer(share, threading.Event())


def _arrays():
    rng = np.random.default_rng(0)
    return [("a", rng.standard_normal((300, 1000), dtype=np.float32)), ("b", np.arange(10, dtype=np.int64))]


def test_a_paced_write_rests_in_both_of_its_threads_and_writes_the_same_bytes(tmp_path, monkeypatch):
    made = []

    class Recorded(pace.Pacer):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            made.append(self)

    monkeypatch.setattr(pace, "Pacer", Recorded)
    plain = write_arrays(str(tmp_path / "plain.npz"), _arrays())
    assert made == []  # not paced outside a paced block
    with pace.paced(0.5, threading.Event()):
        paced = write_arrays(str(tmp_path / "paced.npz"), _arrays())
    assert paced == plain == hashlib.sha256((tmp_path / "paced.npz").read_bytes()).hexdigest()
    assert len(made) == 2 and all(p.rested > 0 for p in made)  # the writer (CRC + copy) and the hash thread
    read = ArrayFile(str(tmp_path / "paced.npz"))
    np.testing.assert_array_equal(read.read("a"), _arrays()[0][1])
    assert pace.current() is None  # the block left nothing behind


def _gated_paced_write(payload_bytes):
    """A write function for CheckpointStore that writes ``payload_bytes`` of arrays (paced when the store's thread
    is) and notes which pace it ran under."""
    seen = {}

    def write(folder):
        seen["pace"] = pace.current()
        data = np.ones(payload_bytes // 4, dtype=np.float32)
        return {arrays.ARRAYS: write_arrays(f"{folder}/{arrays.ARRAYS}", [("w", data)])}

    return write, seen


def test_the_paced_priority_paces_the_write_and_a_wait_finishes_it_at_full_speed(tmp_path, monkeypatch):
    # 2 % of a core per thread by default; here a millionth, so the 64 MB write could only end by being hurried
    monkeypatch.setitem(background.WRITER_PACE, "paced", 1e-6)
    store = CheckpointStore(tmp_path / "ckpt", LocalCommunicator(), keep=3, writer_priority="paced")
    write, seen = _gated_paced_write(64 << 20)
    store.save(write, 1, 0, background=True)
    done, path = threading.Event(), []
    threading.Thread(target=lambda: (path.append(store.wait()), done.set()), daemon=True).start()
    try:
        assert done.wait(BOUND_S), "the wait did not hurry the paced write"
    finally:  # a failure must not leave the write thread (not a daemon) pacing for days
        if "pace" in seen:
            seen["pace"][1].set()
    share, hurry = seen["pace"]
    assert share == 1e-6 and hurry.is_set()
    assert path[0].endswith("ckpt-000000000001")
    store.close()


@pytest.mark.parametrize("priority", ["normal", "low", "idle"])
def test_the_other_priorities_do_not_pace(tmp_path, priority):
    store = CheckpointStore(tmp_path / "ckpt", LocalCommunicator(), keep=3, writer_priority=priority)
    write, seen = _gated_paced_write(1 << 20)
    store.save(write, 1, 0, background=True)
    store.wait()
    assert seen == {"pace": None}
    store.close()


def test_a_bad_priority_names_paced_among_the_choices(tmp_path):
    with pytest.raises(ConfigError, match=r"\['idle', 'low', 'normal', 'paced'\] \(got 'slow'\).*'paced' takes"):
        CheckpointStore(tmp_path / "ckpt", LocalCommunicator(), writer_priority="slow")
