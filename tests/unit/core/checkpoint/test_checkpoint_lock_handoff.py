"""The checkpoint folder's lock changes hands when rank 0 does under in-process recovery.

A worker that joins an in-process job may be given rank 0 while the process that was rank 0 lives on as
another rank and still holds the folder's ``flock``: the new rank 0's first save failed "in use by another
job" (the same host) or went on without the lock (another host). Now the process that stops being rank 0
gives the lock back at its next sync (after its own write in flight), and the new rank 0 waits for it.
Real processes and a real ``flock``; the ranks are a size-1 communicator whose rank the test sets.
"""

import json
import os
import subprocess
import sys
import threading
import time

import pytest
from checkpoint_files import read, writer

from hvdkit.core import CheckpointError, LocalCommunicator, env
from hvdkit.core.checkpoint import CheckpointStore, verify
from hvdkit.core.checkpoint import lock as checkpoint_lock
from hvdkit.core.checkpoint.lock import LOCK_FILE

LINEAGE = "c0ffee01"

# The rank 0 before: saves step 1 (takes the lock), then on "write" starts a background write of step 2 that
# lasts about WRITE_S, and on "down" becomes rank 1 and syncs (settle_locally, as the Trainer's on_resize does).
OLD_RANK0 = """
import os, sys, threading, time
sys.path.insert(0, sys.argv[2])
from checkpoint_files import writer
from hvdkit.core import LocalCommunicator
from hvdkit.core.checkpoint import CheckpointStore

threading.Timer(120, os._exit, (3,)).start()  # bounded, whatever the test does
comm = LocalCommunicator()
store = CheckpointStore(sys.argv[1], comm)
store.save(writer(b"one"), 1, 0)
print("LOCKED", flush=True)

def slow(folder):
    time.sleep(float(sys.argv[3]))
    writer(b"two")(folder)

for line in sys.stdin:
    if line == "write\\n":
        store.save(slow, 2, 0, background=True)
        print("WRITING", flush=True)
    elif line == "down\\n":
        comm.rank = 1
        store.settle_locally()
        print("DOWN", time.time(), flush=True)
os._exit(0)
"""


@pytest.fixture
def in_process(monkeypatch):
    monkeypatch.setenv(env.RECOVERY, "in-process")
    monkeypatch.setenv(env.LINEAGE, LINEAGE)


def start_old_rank0(root, write_s=0.0):
    support = os.path.join(os.path.dirname(__file__), "..", "..", "..", "support")
    proc = subprocess.Popen(
        [sys.executable, "-c", OLD_RANK0, str(root), os.path.abspath(support), str(write_s)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, env.RECOVERY: "in-process", env.LINEAGE: LINEAGE},
    )
    assert proc.stdout.readline() == "LOCKED\n"
    return proc


def tell(proc, what, answer):
    proc.stdin.write(what + "\n")
    proc.stdin.flush()
    line = proc.stdout.readline()
    assert line.startswith(answer), line
    return line


def save_in_thread(store, payload, step):
    """``store.save`` in a thread (the new rank 0 waits in it); its outcome and when it returned."""
    out = {}

    def run():
        try:
            out["path"] = store.save(writer(payload), step, 0)
        except CheckpointError as e:
            out["error"] = e
        out["at"] = time.time()

    thread = threading.Thread(target=run)
    thread.start()
    return thread, out


def holder_pid(root):
    return int(json.loads((root / LOCK_FILE).read_text())["pid"])


def test_the_new_rank0_waits_for_the_old_one_to_step_down_and_then_holds_the_lock(tmp_path, in_process):
    root = tmp_path / "ckpt"
    old = start_old_rank0(root)
    try:
        new = CheckpointStore(root, LocalCommunicator())  # a joiner: no lock yet (deferred, no collective)
        thread, out = save_in_thread(new, b"three", 3)
        time.sleep(1.0)
        assert thread.is_alive() and "error" not in out  # waiting for the lock, not refused "in use"
        assert holder_pid(root) == old.pid
        down = float(tell(old, "down", "DOWN").split()[1])
        thread.join(timeout=30)
        assert not thread.is_alive() and "error" not in out, out
        assert out["at"] >= down  # it wrote only once the old rank 0 had given the lock back
        assert holder_pid(root) == os.getpid()
        assert read(out["path"]) == b"three" and verify(out["path"])["step"] == 3
        new.close()
    finally:
        old.kill()
        old.wait()


def test_a_write_in_flight_is_finished_before_the_lock_changes_hands(tmp_path, in_process):
    """The old rank 0 gives the lock back only after its background write is complete: the new rank 0 then
    finds that checkpoint whole (it is never swept as a dead job's leftover, nor written beside)."""
    root = tmp_path / "ckpt"
    old = start_old_rank0(root, write_s=1.5)
    try:
        tell(old, "write", "WRITING")
        new = CheckpointStore(root, LocalCommunicator())
        thread, out = save_in_thread(new, b"three", 3)
        down = float(tell(old, "down", "DOWN").split()[1])  # returns after the write of step 2 ended
        thread.join(timeout=30)
        assert "error" not in out and out["at"] >= down
        steps = [step for step, _ in new.candidates()]
        assert steps == [3, 2, 1]
        assert read(new.latest().path) == b"three"
        assert read(str(root / "ckpt-000000000002")) == b"two" and verify(str(root / "ckpt-000000000002"))
        new.close()
    finally:
        old.kill()
        old.wait()


def test_a_holder_that_never_steps_down_is_named_after_the_wait(tmp_path, in_process, monkeypatch):
    root = tmp_path / "ckpt"
    old = start_old_rank0(root)
    monkeypatch.setattr(checkpoint_lock, "HANDOFF_WAIT", 0.5)
    try:
        new = CheckpointStore(root, LocalCommunicator())
        t0 = time.monotonic()
        with pytest.raises(CheckpointError) as err:
            new.save(writer(b"three"), 3, 0)
        assert time.monotonic() - t0 >= 0.5
        assert f"process {old.pid}" in str(err.value) and "did not give back the folder's lock within 0.5 s" in str(
            err.value
        )
        assert [step for step, _ in new.candidates()] == [1]  # nothing written, nothing lost
    finally:
        old.kill()
        old.wait()


@pytest.mark.parametrize("case", ["another job", "not in-process"])
def test_only_a_holder_of_this_in_process_job_is_waited_for(tmp_path, in_process, monkeypatch, case):
    root = tmp_path / "ckpt"
    old = start_old_rank0(root)
    if case == "another job":
        monkeypatch.setenv(env.LINEAGE, "beef0002")
    else:
        monkeypatch.delenv(env.RECOVERY)
    try:
        t0 = time.monotonic()
        with pytest.raises(CheckpointError, match="in use by another job"):
            CheckpointStore(root, LocalCommunicator()).save(writer(b"three"), 3, 0)
        assert time.monotonic() - t0 < checkpoint_lock.HANDOFF_WAIT / 2  # refused at once, as before
    finally:
        old.kill()
        old.wait()
