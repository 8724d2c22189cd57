"""Background checkpoint writes with a size-1 communicator: one write in flight, outcomes never lost."""

import logging
import os
import threading
import time

import pytest
from checkpoint_files import read, writer

from hvdkit.core import CheckpointError, LocalCommunicator
from hvdkit.core.checkpoint import CheckpointStore
from hvdkit.core.checkpoint.lock import LOCK_FILE

BOUND_S = 60  # a gate never opened would fail the test here instead of hanging it


class WhenLogged(logging.Handler):
    """Sets ``seen`` when the checkpoint logger emits a message containing ``text``."""

    def __init__(self, text):
        super().__init__(logging.DEBUG)
        self.text, self.seen, self.messages = text, threading.Event(), []

    def emit(self, record):
        self.messages.append(record.getMessage())
        if self.text in record.getMessage():
            self.seen.set()


@pytest.fixture
def checkpoint_log():
    logger = logging.getLogger("hvdkit.checkpoint")
    level = logger.level
    handlers = []

    def watch(text):
        handler = WhenLogged(text)
        logger.addHandler(handler)
        handlers.append(handler)
        return handler

    logger.setLevel(logging.DEBUG)
    yield watch
    logger.setLevel(level)
    for h in handlers:
        logger.removeHandler(h)


def gated_writer(payload, gate, events, name):
    def write(folder):
        events.append(f"{name} begins")
        assert gate.wait(BOUND_S), f"{name} was never released"
        writer(payload)(folder)
        events.append(f"{name} ends")

    return write


def test_a_save_waits_for_the_write_in_flight_and_says_so_once(tmp_path, checkpoint_log):
    store = CheckpointStore(tmp_path / "ckpt", LocalCommunicator(), keep=3)
    events, gate = [], threading.Event()
    waiting = checkpoint_log("waiting for the background write of step 1")

    def release_when_step_2_waits():  # proves save(2) blocked: the gate opens only once it waits
        waiting.seen.wait(BOUND_S)
        events.append("released")
        gate.set()

    path = store.save(gated_writer(b"one", gate, events, "write 1"), 1, 0, background=True)
    assert path == os.path.join(store.root, "ckpt-000000000001")
    assert store.candidates() == []  # nothing in place yet: the write is held at the gate
    deadline = time.monotonic() + BOUND_S  # the write thread runs at a low priority: let it begin first
    while "write 1 begins" not in events and time.monotonic() < deadline:
        time.sleep(0.01)
    threading.Thread(target=release_when_step_2_waits, daemon=True).start()
    open_gate = threading.Event()
    open_gate.set()
    store.save(gated_writer(b"two", open_gate, events, "write 2"), 2, 0, background=False)
    events.append("save 2 returned")
    assert events == ["write 1 begins", "released", "write 1 ends", "write 2 begins", "write 2 ends", "save 2 returned"]
    told = [m for m in waiting.messages if "waited" in m]
    assert len(told) == 1 and "the save of step 2 waited" in told[0] and "write of step 1" in told[0]
    store.save(writer(b"three"), 3, 0, background=True)
    store.save(writer(b"four"), 4, 0, background=True)  # may or may not wait: never said again
    assert store.wait() == os.path.join(store.root, "ckpt-000000000004")
    assert len([m for m in waiting.messages if "waited" in m]) == 1
    assert [os.path.basename(p) for _, p in store.candidates()] == [f"ckpt-00000000000{s}" for s in (4, 3, 2)]


def test_a_failed_background_write_is_raised_by_wait_naming_its_step_and_cause(tmp_path):
    store = CheckpointStore(tmp_path / "ckpt", LocalCommunicator(), keep=3)
    store.save(writer(b"good"), 1, 0, background=True)

    def full_disk(folder):
        raise OSError(28, "No space left on device")

    store.save(full_disk, 2, 0, background=True)  # returns: the failure is not known yet
    with pytest.raises(CheckpointError) as e:
        store.wait()
    assert "checkpoint of step 2 was not saved" in str(e.value) and "No space left on device" in str(e.value)
    assert store.wait() is None  # raised once, then settled
    assert sorted(os.listdir(store.root)) == [LOCK_FILE, "ckpt-000000000001"]  # no temporary folder left
    assert store.load(read)[0] == b"good"


def test_a_failed_background_write_is_raised_by_the_next_save_which_then_writes_nothing(tmp_path):
    store = CheckpointStore(tmp_path / "ckpt", LocalCommunicator(), keep=3)

    def broken(folder):
        raise ValueError("tensor went away")

    store.save(broken, 5, 0, background=True)
    with pytest.raises(CheckpointError, match="step 5 was not saved.*ValueError: tensor went away"):
        store.save(writer(b"six"), 6, 0, background=True)
    assert store.candidates() == [] and store.wait() is None
    store.save(writer(b"seven"), 7, 0, background=True)
    assert store.load(read)[0] == b"seven"  # a load waits for the write in flight first


def test_close_finishes_the_write_in_flight_before_releasing_the_folder(tmp_path):
    store = CheckpointStore(tmp_path / "ckpt", LocalCommunicator(), keep=3)
    gate, events = threading.Event(), []
    store.save(gated_writer(b"x", gate, events, "write"), 1, 0, background=True)
    threading.Timer(0.2, gate.set).start()
    store.close()
    assert events == ["write begins", "write ends"]
    assert os.path.isdir(os.path.join(store.root, "ckpt-000000000001"))


def _nice_of_this_thread():
    with open(f"/proc/self/task/{threading.get_native_id()}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[16])  # field 19 of stat: nice


def test_the_write_and_the_threads_it_starts_run_at_the_low_writer_priority_the_copy_before_them_does_not(tmp_path):
    # On 2 busy cores a write at training's priority made each step 4x slower (docs/bench/ckpt-async-2026-11-28);
    # at nice 19 it takes only what training leaves (not the default: the newest checkpoint then lags)
    store = CheckpointStore(tmp_path / "ckpt", LocalCommunicator(), keep=3, writer_priority="low")
    seen, before = {}, _nice_of_this_thread()

    def write(folder):
        seen["writer"] = _nice_of_this_thread()
        helper = threading.Thread(target=lambda: seen.update(helper=_nice_of_this_thread()))
        helper.start()
        helper.join()
        writer(b"x")(folder)

    def copy():  # training may be waiting for it: at training's priority
        seen["copy"] = _nice_of_this_thread()

    store.save(write, 1, 0, background=True, copy=copy)
    store.wait()
    assert seen == {"copy": before, "writer": 19, "helper": 19}
    assert _nice_of_this_thread() == before  # the training thread keeps its priority


def _policy_of_this_thread():
    return os.sched_getscheduler(threading.get_native_id())


def test_the_idle_writer_priority_runs_the_write_and_its_threads_under_sched_idle_the_copy_and_training_not(tmp_path):
    # "low" alone did not keep 2-thread steps at their time on 2 busy cores (docs/checkpoint-format.md): a
    # nice-19 task keeps the core for its slice; a SCHED_IDLE one gives it up to a waking training thread
    store = CheckpointStore(tmp_path / "ckpt", LocalCommunicator(), keep=3, writer_priority="idle")
    seen, before = {}, (_nice_of_this_thread(), _policy_of_this_thread())

    def write(folder):
        seen["writer"] = (_nice_of_this_thread(), _policy_of_this_thread())
        helper = threading.Thread(target=lambda: seen.update(helper=(_nice_of_this_thread(), _policy_of_this_thread())))
        helper.start()
        helper.join()
        writer(b"x")(folder)

    def copy():
        seen["copy"] = (_nice_of_this_thread(), _policy_of_this_thread())

    store.save(write, 1, 0, background=True, copy=copy)
    assert store.wait().endswith("ckpt-000000000001")
    assert before[1] == os.SCHED_OTHER
    assert seen == {"copy": before, "writer": (19, os.SCHED_IDLE), "helper": (19, os.SCHED_IDLE)}
    assert (_nice_of_this_thread(), _policy_of_this_thread()) == before


class RankChanges(LocalCommunicator):
    """A size-1 communicator whose rank is what the test sets: a process that becomes rank 0 (in-process
    recovery after rank 0 was lost) is rank 0 from then on, in the same process."""

    def __init__(self, rank):
        self.rank = rank

    def broadcast_object(self, obj, name, root=0):
        if self.rank != root and name == "hvdkit.checkpoint.save":
            return ("started", "the path rank 0 (another process) names")  # what rank 0 says: it writes
        return super().broadcast_object(obj, name, root)


def test_a_write_the_lost_rank_0_had_in_flight_is_said_lost_on_the_new_rank_0_and_its_next_save_works(
    tmp_path, checkpoint_log
):
    comm = RankChanges(1)
    store = CheckpointStore(tmp_path, comm)  # not rank 0: no lock, no thread
    store.save(writer(b"seven"), 7, 0, background=True)  # rank 0 (another process) writes it; here only the step
    comm.rank = 0  # that process is gone; this one is rank 0 now
    said = checkpoint_log("was being written in the background by the process that was rank 0")
    # before: CheckpointError "the checkpoint of step 7 was not saved (no outcome)" ended the job
    path = store.save(writer(b"eight"), 8, 0)
    assert said.seen.is_set()
    assert read(path) == b"eight" and os.path.basename(path).endswith("8")
    assert store.wait() is None
    store.close()


def test_a_copy_that_fails_ends_the_wait_for_it_and_is_raised_at_the_next_wait_writing_nothing(tmp_path):
    from hvdkit.core.checkpoint.background import wait_for_copies

    store = CheckpointStore(tmp_path / "ckpt", LocalCommunicator(), keep=3)
    gate, written = threading.Event(), []

    def copy():
        assert gate.wait(BOUND_S)
        raise MemoryError("no room for the host copy")

    store.save(lambda folder: written.append(folder), 3, 0, background=True, copy=copy)
    assert store.copying
    threading.Timer(0.2, gate.set).start()
    wait_for_copies()  # what an optimizer's step() calls: returns once the copy ended, failed or not
    assert not store.copying
    with pytest.raises(CheckpointError, match="step 3 was not saved.*MemoryError: no room for the host copy"):
        store.wait()
    assert written == [] and store.candidates() == []
    store.close()
