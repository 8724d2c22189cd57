"""Checkpoint folder safety in one process: re-saving a step, corrupt checkpoints and keep, one job
per folder (the lock), and data that would not read back (pure file-system logic, no MPI)."""

import fcntl
import os
import pathlib
import socket
import subprocess
import sys

import numpy as np
import pytest
from checkpoint_files import check_json_plain, read, writer

from hvdkit.core import CheckpointError, ConfigError, LocalCommunicator, env
from hvdkit.core.checkpoint import CheckpointStore, verify
from hvdkit.core.checkpoint.lock import LOCK_FILE


def newest_loadable(store):
    """What ``load`` would give right now: (step, payload) of the newest checkpoint that verifies."""
    for step, path in store.candidates():
        try:
            verify(path)
        except CheckpointError:
            continue
        return step, read(path)
    return None


def test_saving_a_step_again_keeps_a_complete_copy_of_it_at_every_rename(tmp_path, monkeypatch):
    store = CheckpointStore(tmp_path / "ckpt", LocalCommunicator(), keep=1)
    store.save(writer(b"first copy"), step=7, epoch=1)
    seen = []
    real_rename = os.rename

    def rename(src, dst):  # what a crash right before this rename would leave
        seen.append(newest_loadable(store))
        real_rename(src, dst)

    monkeypatch.setattr(os, "rename", rename)
    path = store.save(writer(b"second copy"), step=7, epoch=2)
    monkeypatch.undo()
    seen.append(newest_loadable(store))
    assert len(seen) >= 3
    assert all(s in ((7, b"first copy"), (7, b"second copy")) for s in seen), seen
    assert seen[-1] == (7, b"second copy") and os.path.basename(path) == "ckpt-000000000007"
    store.wait_for_cleanup()
    assert sorted(os.listdir(store.root)) == [LOCK_FILE, "ckpt-000000000007"]


@pytest.mark.parametrize("failing", [2, 3])
def test_a_full_disk_between_the_renames_of_a_resave_keeps_a_loadable_copy(tmp_path, monkeypatch, failing):
    store = CheckpointStore(tmp_path / "ckpt", LocalCommunicator(), keep=1)
    store.save(writer(b"first copy"), step=7, epoch=1)
    calls = []
    real_rename = os.rename

    def rename(src, dst):
        calls.append(src)
        if len(calls) == failing:
            raise OSError(28, "No space left on device")
        real_rename(src, dst)

    monkeypatch.setattr(os, "rename", rename)
    try:
        store.save(writer(b"second copy"), step=7, epoch=2)
    except CheckpointError:
        pass  # failing is allowed; losing step 7 is not
    monkeypatch.undo()
    assert newest_loadable(store) in ((7, b"first copy"), (7, b"second copy"))
    store.save(writer(b"third copy"), step=7, epoch=3)  # the next save of the step tidies up
    store.wait_for_cleanup()
    assert sorted(os.listdir(store.root)) == [LOCK_FILE, "ckpt-000000000007"]
    assert store.load(read)[0] == b"third copy"


def test_copies_left_by_interrupted_resaves_load_newest_first_and_the_next_resave_replaces_them(tmp_path):
    store = CheckpointStore(tmp_path / "ckpt", LocalCommunicator(), keep=1)
    store.save(writer(b"oldest"), step=3, epoch=1)
    elsewhere = CheckpointStore(tmp_path / "elsewhere", LocalCommunicator(), keep=1)
    for payload, generation in ((b"older", 2), (b"newer", 4)):  # as crashes mid-resave leave them
        made = elsewhere.save(writer(payload), step=3, epoch=1)
        os.rename(made, os.path.join(store.root, f"ckpt-000000000003.{generation}"))
    assert [os.path.basename(p) for _, p in store.candidates()] == [
        "ckpt-000000000003.4",
        "ckpt-000000000003.2",
        "ckpt-000000000003",
    ]
    assert store.load(read)[0] == b"newer"
    path = store.save(writer(b"newest"), step=3, epoch=1)  # replaces every copy
    assert os.path.basename(path) == "ckpt-000000000003"
    assert [os.path.basename(p) for _, p in store.candidates()] == ["ckpt-000000000003"]
    assert store.load(read)[0] == b"newest"


def test_a_corrupt_checkpoint_does_not_count_toward_keep(tmp_path):
    store = CheckpointStore(tmp_path / "ckpt", LocalCommunicator(), keep=2)
    for step in (1, 2, 3):
        store.save(writer(bytes([step]) * 8), step=step, epoch=step)
    with open(os.path.join(store.root, "ckpt-000000000003", "state.bin"), "r+b") as f:
        f.write(b"X")  # same size, wrong bytes
    store.save(writer(b"\x04" * 8), step=4, epoch=4)
    assert [s for s, _ in store.candidates()] == [4, 2]  # not [4, 3] with 3 unloadable
    with open(os.path.join(store.root, "ckpt-000000000004", "state.bin"), "r+b") as f:
        f.write(b"X")
    state, info = store.load(read)
    assert (info.step, state) == (2, b"\x02" * 8)


def test_saves_leave_another_jobs_temporary_entries_alone(tmp_path):
    store = CheckpointStore(tmp_path / "ckpt", LocalCommunicator(), keep=1)
    other = os.path.join(store.root, ".tmp-0therj0b-ckpt-000000000009-0123abcd")  # a write in progress
    os.makedirs(other)
    writer(b"theirs")(other)
    for step in (1, 2, 3):
        store.save(writer(b"mine"), step=step, epoch=step)
    store.wait_for_cleanup()
    assert read(other) == b"theirs"
    assert sorted(os.listdir(store.root)) == [
        LOCK_FILE,
        ".tmp-0therj0b-ckpt-000000000009-0123abcd",
        "ckpt-000000000003",
    ]


def test_the_next_job_to_lock_the_folder_removes_what_dead_jobs_left(tmp_path):
    first = CheckpointStore(tmp_path / "ckpt", LocalCommunicator(), keep=1)
    first.save(writer(b"kept"), step=1, epoch=1)
    for name in (".tmp-deadj0b1-ckpt-000000000002-0123abcd", ".tmp-ckpt-000000000002-deadbeef"):
        os.makedirs(os.path.join(first.root, name))
    first.close()
    second = CheckpointStore(tmp_path / "ckpt", LocalCommunicator(), keep=1)
    second.wait_for_cleanup()
    assert sorted(os.listdir(second.root)) == [LOCK_FILE, "ckpt-000000000001"]
    assert second.load(read)[0] == b"kept"


def lock_is_free(root):
    fd = os.open(os.path.join(root, LOCK_FILE), os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # another open file: conflicts even in-process
        return True
    except BlockingIOError:
        return False
    finally:
        os.close(fd)


def test_stores_of_one_process_share_the_lock_until_the_last_one_is_closed(tmp_path):
    a = CheckpointStore(tmp_path / "ckpt", LocalCommunicator())
    b = CheckpointStore(tmp_path / "ckpt", LocalCommunicator())  # the same job: no error
    assert not lock_is_free(a.root)
    a.close()
    assert not lock_is_free(a.root)
    b.close()
    assert lock_is_free(a.root)
    c = CheckpointStore(tmp_path / "ckpt", LocalCommunicator())
    del c  # garbage collected: released as well
    assert lock_is_free(a.root)


HOLDER = """
import os, sys, threading
from hvdkit.core import CheckpointStore, LocalCommunicator

threading.Timer(120, os._exit, (3,)).start()  # bounded: a waiting second store would see it exit
store = CheckpointStore(sys.argv[1], LocalCommunicator())
print("LOCKED", flush=True)
sys.stdin.read()
os._exit(0)
"""


@pytest.mark.parametrize("end", ["exit", "sigkill"])
def test_a_second_process_gets_an_error_naming_the_holder_until_the_holder_ends(tmp_path, end):
    root = tmp_path / "ckpt"
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(root)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout.readline() == "LOCKED\n"
        with pytest.raises(CheckpointError) as err:  # at once: it does not wait for the lock
            CheckpointStore(root, LocalCommunicator())
        assert holder.poll() is None  # refused while the holder still runs
        message = str(err.value)
        assert f"in use by another job: host {socket.gethostname()}, pid {holder.pid}, job " in message
        assert "--checkpoint-dir" in message and f"end that job first (pid {holder.pid}" in message
        if end == "exit":
            holder.stdin.close()
        else:
            holder.kill()
        holder.wait(timeout=60)
    finally:
        holder.kill()
        holder.wait()
    store = CheckpointStore(root, LocalCommunicator())  # released however the holder ended
    assert f'"pid": {os.getpid()}' in (root / LOCK_FILE).read_text()
    store.close()


def test_an_elastic_attempt_goes_on_where_a_lost_attempt_of_its_own_job_still_holds_the_lock(tmp_path, monkeypatch):
    """NFS keeps a lock after its host is lost: every relaunch of the elastic job failed "in use".
    The holder of the same lineage on another host is that lost attempt; anyone else is refused."""
    root = tmp_path / "ckpt"
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(root)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, env.LINEAGE: "feed01"},
    )
    try:
        assert holder.stdout.readline() == "LOCKED\n"
        assert '"lineage": "feed01"' in (root / LOCK_FILE).read_text()
        monkeypatch.setattr(socket, "gethostname", lambda: "node-b")  # rank 0 relaunched on another host
        for lineage in (None, "beef02"):  # another job, or no elastic job: refused as before
            if lineage is None:
                monkeypatch.delenv(env.LINEAGE, raising=False)
            else:
                monkeypatch.setenv(env.LINEAGE, lineage)
            with pytest.raises(CheckpointError, match="in use by another job"):
                CheckpointStore(root, LocalCommunicator())
        monkeypatch.setenv(env.LINEAGE, "feed01")
        store = CheckpointStore(root, LocalCommunicator())  # its own lost attempt: goes on
        store.close()
        monkeypatch.undo()
        monkeypatch.setenv(env.LINEAGE, "feed01")  # the same lineage on the holder's own host: a live holder
        with pytest.raises(CheckpointError, match="in use by another job"):
            CheckpointStore(root, LocalCommunicator())
    finally:
        holder.kill()
        holder.wait()


@pytest.mark.parametrize(
    ("extra", "path", "kind"),
    [
        ({"best": np.float64(0.5)}, "extra['best']", "numpy.float64"),
        ({"log": [1, {"n": np.int64(3)}]}, "extra['log'][1]['n']", "numpy.int64"),
        ({"w": np.zeros(2)}, "extra['w']", "numpy.ndarray"),
        ({"dir": pathlib.Path("/data")}, "extra['dir']", "pathlib.PosixPath"),
        ({"pos": (1, 2)}, "extra['pos']", "tuple"),
        ({3: "three"}, "extra has the key 3", "int"),
    ],
)
def test_data_json_would_not_give_back_as_it_was_is_named_with_its_type(extra, path, kind):
    with pytest.raises(ConfigError) as err:
        check_json_plain(extra, "extra")
    assert f"{path} is a {kind}" in str(err.value) or f"{path} (an {kind})" in str(err.value)


def test_plain_json_data_passes_the_check():
    check_json_plain({"a": [1, 2.5, "x", None, True, {"b": []}], "c": float("inf")}, "extra")


def test_a_check_that_fails_raises_config_error_and_writes_nothing(tmp_path):
    store = CheckpointStore(tmp_path / "ckpt", LocalCommunicator())
    store.save(writer(b"one"), step=1, epoch=1)

    def check():
        check_json_plain({"k": (1,)}, "extra")

    with pytest.raises(ConfigError, match=r"step 2 was not saved: extra\['k'\] is a tuple.*use a list"):
        store.save(writer(b"two"), step=2, epoch=2, check=check)
    assert sorted(os.listdir(store.root)) == [LOCK_FILE, "ckpt-000000000001"]
