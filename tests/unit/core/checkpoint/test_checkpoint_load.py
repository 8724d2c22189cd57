"""Loading on rank 0 (size-1 communicator): every failure comes back as a CheckpointError."""

import shutil

import pytest
from checkpoint_files import read, writer

from hvdkit.core import CheckpointError, LocalCommunicator
from hvdkit.core.checkpoint import CheckpointStore

write_payload = writer(b"payload")
read_payload = read


@pytest.fixture
def store(tmp_path):
    return CheckpointStore(tmp_path / "ckpt", LocalCommunicator(), keep=2)


def test_a_folder_that_became_a_file_gives_a_checkpoint_error_naming_it_and_the_fix(store):
    shutil.rmtree(store.root)
    with open(store.root, "w") as f:
        f.write("not a folder")
    with pytest.raises(CheckpointError) as err:
        store.load_on_rank0(read_payload)
    assert store.root in str(err.value) and "Not a directory" in str(err.value) and "--checkpoint-dir" in str(err.value)


def test_load_on_rank0_gives_the_state_the_header_of_describe_and_the_info(store):
    store.save(write_payload, step=4, epoch=1)
    state, header, info = store.load_on_rank0(read_payload, describe=lambda s, i: {"n": len(s), "step": i.step})
    assert (state, header, info.step, info.epoch) == (b"payload", {"n": 7, "step": 4}, 4, 1)


def test_a_describe_that_raises_gives_its_checkpoint_error_unchanged(store):
    store.save(write_payload, step=4, epoch=1)

    def describe(state, info):
        raise CheckpointError("does not fit this model")

    with pytest.raises(CheckpointError, match="^does not fit this model$"):
        store.load_on_rank0(read_payload, describe)


def test_no_checkpoint_gives_none(store):
    assert store.load_on_rank0(read_payload, describe=lambda s, i: 1 / 0) is None
