"""The background write thread never calls the communicator: under ``--recovery in-process`` a reset shuts
Horovod down while a write is in flight, and the checkpoint must still be written (size-1 communicator)."""

import os
import threading
import time

from checkpoint_files import read, writer
from shut_down_comm import ShutDownLater

from hvdkit.core import LocalCommunicator
from hvdkit.core.checkpoint import CheckpointStore, verify

BOUND_S = 60  # a gate never opened fails the test here instead of hanging it


def _until_written(store):
    deadline = time.monotonic() + BOUND_S
    while store.writing and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not store.writing, "the background write never ended"


def test_a_background_write_in_flight_when_horovod_shuts_down_still_writes_a_checkpoint_that_verifies(tmp_path):
    comm = ShutDownLater()
    store = CheckpointStore(tmp_path / "ckpt", comm, keep=3)
    gate = threading.Event()

    def held_write(folder):  # the write is under way when the reset shuts Horovod down
        assert gate.wait(BOUND_S), "the test never released the write"
        writer(b"step 92")(folder)

    path = store.save(held_write, 92, 3, background=True)
    comm.down = True  # a reset: hvd.shutdown() while the write is in flight
    gate.set()
    _until_written(store)
    comm.down = False  # hvd.init() of the reset: the next settle shares the outcome
    # before: CheckpointError "the checkpoint of step 92 was not saved: ... (ValueError: Horovod has not been
    # initialized; use hvd.init().)"
    assert store.wait() == path == os.path.join(store.root, "ckpt-000000000092")
    manifest = verify(path)
    assert (manifest["step"], manifest["epoch"], manifest["world_size"]) == (92, 3, 1)
    assert read(path) == b"step 92"
    assert [n for n in comm.users if n.startswith("hvdkit-ckpt-write")] == []
    store.close()


def test_close_after_horovod_shut_down_finishes_the_write_in_flight_and_releases_the_folder(tmp_path):
    comm = ShutDownLater()
    store = CheckpointStore(tmp_path / "ckpt", comm, keep=3)
    gate = threading.Event()

    def held_write(folder):
        assert gate.wait(BOUND_S), "the test never released the write"
        writer(b"step 40")(folder)

    path = store.save(held_write, 40, 1, background=True)
    comm.down = True  # Horovod shut down (its atexit handler, or a reset) before the write was waited for
    threading.Timer(0.2, gate.set).start()
    store.close()  # before: ValueError "Horovod has not been initialized" from close(), the write not waited for
    assert not store.writing
    assert read(path) == b"step 40" and verify(path)["step"] == 40
    comm.down = False
    again = CheckpointStore(tmp_path / "ckpt", LocalCommunicator(), keep=3)  # the lock was released
    assert again.latest().path == path
    again.close()
