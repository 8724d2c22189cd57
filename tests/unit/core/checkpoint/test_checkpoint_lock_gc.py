"""The checkpoint folder lock and the garbage collector (one process, no MPI).

A store gives its lock back from a ``weakref.finalize`` callback when it is collected, and the
collector runs wherever Python allocates, also inside ``acquire`` while it holds the lock table's
guard. With a plain lock that release waited for the guard its own thread held: the process hung
for good (seen as a stalled unit test, in a Hypothesis run that made many stores)."""

import gc
import threading
import weakref

from hvdkit.core.checkpoint import lock as checkpoint_lock


class Cycle:
    """An object only the cyclic collector frees (its finalizer runs at an arbitrary gc.collect())."""

    def __init__(self):
        self.me = self


def test_a_lock_released_by_the_collector_inside_acquire_does_not_hang_the_process(tmp_path, monkeypatch):
    old, new = tmp_path / "old", tmp_path / "new"
    old.mkdir()
    new.mkdir()
    held = checkpoint_lock.acquire(str(old))
    garbage = Cycle()
    weakref.finalize(garbage, checkpoint_lock.release, held)  # as CheckpointStore registers it
    del garbage
    write = checkpoint_lock._write_holder
    monkeypatch.setattr(
        checkpoint_lock, "_write_holder", lambda fd, job: (gc.collect(), write(fd, job))
    )  # GC right there
    got = {}
    worker = threading.Thread(target=lambda: got.update(lock=checkpoint_lock.acquire(str(new))), daemon=True)
    worker.start()
    worker.join(30)
    assert not worker.is_alive(), "acquire() hung: the collector's release waited for the guard acquire() held"
    assert held.key not in checkpoint_lock._HELD and got["lock"].key in checkpoint_lock._HELD  # old one given back
    checkpoint_lock.release(got["lock"])
    assert not checkpoint_lock._HELD
