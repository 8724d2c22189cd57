"""The rank-0 checkpoint protocol with a size-1 communicator (pure file-system logic)."""

import json
import os

import pytest
from checkpoint_files import read, writer

from hvdkit.core import CheckpointError, ConfigError, LocalCommunicator
from hvdkit.core.checkpoint import CheckpointStore, verify
from hvdkit.core.checkpoint.lock import LOCK_FILE
from hvdkit.core.checkpoint.manifest import seal


@pytest.fixture
def store(tmp_path):
    return CheckpointStore(tmp_path / "ckpt", LocalCommunicator(), keep=2)


def test_save_writes_a_verified_manifest_and_leaves_no_temporary_folder(store):
    path = store.save(writer(b"abc"), step=10, epoch=1)
    assert os.path.basename(path) == "ckpt-000000000010"
    manifest = verify(path)
    assert manifest["step"] == 10 and manifest["epoch"] == 1 and manifest["world_size"] == 1
    assert manifest["files"]["state.bin"]["size"] == 3
    assert sorted(os.listdir(store.root)) == [LOCK_FILE, "ckpt-000000000010"]


def test_only_the_newest_keep_checkpoints_remain(store):
    for step in range(1, 6):
        store.save(writer(bytes([step])), step=step, epoch=step)
    assert [os.path.basename(p) for _, p in store.candidates()] == ["ckpt-000000000005", "ckpt-000000000004"]
    store.wait_for_cleanup()  # old ones are deleted in the background
    assert sorted(os.listdir(store.root)) == [LOCK_FILE, "ckpt-000000000004", "ckpt-000000000005"]
    state, info = store.load(read)
    assert (state, info.step) == (b"\x05", 5)


def test_corrupted_newest_checkpoint_falls_back_to_the_previous_one(store, caplog):
    store.save(writer(b"old"), step=1, epoch=1)
    newest = store.save(writer(b"new"), step=2, epoch=2)
    with open(os.path.join(newest, "state.bin"), "r+b") as f:
        f.write(b"X")  # flip a byte, same size
    state, info = store.load(read)
    assert (state, info.step) == (b"old", 1)
    assert "SHA-256" in caplog.text and "ckpt-000000000002" in caplog.text


def test_a_write_that_fails_raises_and_keeps_earlier_checkpoints(store):
    store.save(writer(b"good"), step=1, epoch=1)

    def broken(folder):
        writer(b"half")(folder)
        raise OSError("disk full")

    with pytest.raises(CheckpointError, match="disk full"):
        store.save(broken, step=2, epoch=2)
    assert sorted(os.listdir(store.root)) == [LOCK_FILE, "ckpt-000000000001"]
    assert store.load(read)[0] == b"good"


def test_a_leftover_temporary_folder_is_never_loaded(store):
    store.save(writer(b"done"), step=1, epoch=1)
    partial = os.path.join(store.root, ".tmp-ckpt-000000000002-deadbeef")
    os.makedirs(partial)
    writer(b"partial")(partial)
    assert store.load(read)[0] == b"done"


def test_a_manifest_naming_a_file_outside_the_checkpoint_is_rejected(store, tmp_path):
    path = store.save(writer(b"x"), step=1, epoch=1)
    mpath = os.path.join(path, "manifest.json")
    with open(mpath) as f:
        manifest = json.load(f)
    manifest["files"] = {"../../etc/passwd": {"size": 1, "sha256": "0"}}
    with open(mpath, "w") as f:
        json.dump(manifest, f)
    with pytest.raises(CheckpointError, match="does not match its own SHA-256"):
        verify(path)  # an edited manifest no longer matches its seal
    with open(mpath, "w") as f:
        json.dump(seal(manifest), f)  # sealed again, as a deliberate forgery would be
    with pytest.raises(CheckpointError, match="unsafe file"):
        verify(path)


def test_a_manifest_from_before_the_seal_still_loads_and_a_stripped_seal_does_not(store):
    path = store.save(writer(b"old"), step=3, epoch=1)
    mpath = os.path.join(path, "manifest.json")
    with open(mpath) as f:
        manifest = json.load(f)
    assert manifest["format"] == 2 and len(manifest["manifest_sha256"]) == 64
    legacy = {k: v for k, v in manifest.items() if k != "manifest_sha256"}
    with open(mpath, "w") as f:
        json.dump(legacy, f)
    with pytest.raises(CheckpointError, match="has no manifest_sha256"):
        verify(path)  # format 2 without its seal: damaged
    legacy["format"] = 1  # what hvdkit wrote before the seal
    with open(mpath, "w") as f:
        json.dump(legacy, f)
    assert verify(path)["step"] == 3
    with open(mpath, "w") as f:
        json.dump({**legacy, "manifest_sha256": manifest["manifest_sha256"]}, f)
    with pytest.raises(CheckpointError, match="does not match its own SHA-256"):
        verify(path)  # a sealed manifest whose format was changed to 1


def test_no_checkpoint_means_a_fresh_start(store):
    assert store.load(read) is None


def test_an_unwritable_directory_fails_before_training_and_names_the_fix(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    with pytest.raises(CheckpointError, match=r"a-file/ckpt.*not writable.*--checkpoint-dir"):
        CheckpointStore(blocker / "ckpt", LocalCommunicator())


def test_keep_must_be_positive(tmp_path):
    with pytest.raises(ConfigError, match="got 0"):
        CheckpointStore(tmp_path, LocalCommunicator(), keep=0)
