"""torch checkpoints on 2 real ranks: ``extra`` that would not come back as it was at resume is a
ConfigError on every rank at save time, naming key path and type; nothing is written. Before the
check, such a save succeeded and every checkpoint of the run was unloadable.

Background saves (``async_save=True``) in the same job: the state at ``save`` time comes back
bitwise as a synchronous save's, although the model trained on while the write was held; a write
that fails on rank 0 is raised on both ranks by ``wait`` and by the next ``save``; hvdkit's optimizers
(plain, ZeRO-1, ZeRO-1 through ``hk.amp_step``) stepping straight after an async save wait for rank 0's
copy of the state, and the checkpoint is the sync save's bytes."""

import pool
import pytest

pytestmark = pytest.mark.dist


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    return pool.run_worker("mpirun", "torch", "checkpoint_extra_torch", tmp_path_factory.mktemp("extra"), timeout=300)


@pytest.mark.parametrize(
    ("case", "named", "fix"),
    [
        ("np_float64", "extra['best_loss'] is a numpy.float64", ".item()"),
        ("np_int64", "extra['seen'][1]['batches'] is a numpy.int64", ".item()"),
        ("ndarray", "extra['weights'] is a numpy.ndarray", ".tolist()"),
        ("path", "extra['data'] is a pathlib.PosixPath", "str(path)"),
    ],
)
def test_extra_that_would_not_load_is_refused_on_every_rank_naming_key_and_type(ranks, case, named, fix):
    messages = [r["errors"][case] for r in ranks]
    assert messages[0] is not None and messages[0] == messages[1]  # rank 1 passed None: rank 0's finding
    assert named in messages[0] and "a checkpoint cannot give back as it was" in messages[0] and fix in messages[0]
    assert "step 2 was not saved" in messages[0] and "(nothing was written)" in messages[0]


def test_nothing_is_written_for_a_refused_save(ranks):
    assert ranks[0]["listing_after_refusals"] == [".hvdkit.lock", "ckpt-000000000001"]


def test_plain_extra_with_tuples_and_tensors_resumes_equal_and_with_its_types(ranks):
    for r in ranks:
        assert r["resumed_step"] == 3 and r["resumed_equal"]
        assert r["resumed_types"] == {"loss": "float", "n": "int", "pair": "tuple", "t": "Tensor", "nested": "dict"}


def test_an_async_save_restores_bitwise_as_a_sync_save_of_the_same_state_while_training_went_on(ranks):
    first = ranks[0]["async_vs_sync"]
    assert first["path"] == first["written"] == "async/ckpt-000000000004"
    assert first["in_place_when_save_returned"] is False  # save returned before rank 0 wrote anything
    assert first["same_arrays_file"]  # the two arrays files are the same bytes
    for r in ranks:
        a = r["async_vs_sync"]
        assert a["moved_on"] and a["saved"] == first["saved"]
        for how in ("sync", "async"):
            assert a[how]["before"] != a["saved"]  # the fresh model really differed
            assert a[how]["after"] == a["saved"], f"{how} restore is not the state at save time"
            assert (a[how]["step"], a[how]["extra"]) == (4, {"k": 1})


def test_a_failed_background_write_raises_on_every_rank_naming_the_step_and_the_cause(ranks):
    at_wait = [r["write_error"]["at_wait"] for r in ranks]
    at_save = [r["write_error"]["at_next_save"] for r in ranks]
    assert at_wait[0] is not None and at_wait[0] == at_wait[1]  # rank 1 writes nothing: rank 0's outcome
    assert at_save[0] is not None and at_save[0] == at_save[1]
    for message, step in ((at_wait[0], 2), (at_save[0], 3)):
        assert f"the checkpoint of step {step} was not saved" in message
        assert "File too large" in message and "the checkpoints before it are untouched" in message
    assert ranks[0]["write_error"]["listing"] == [".hvdkit.lock", "ckpt-000000000001", "ckpt-000000000005"]


@pytest.mark.parametrize("kind", ["plain", "sharded", "sharded_amp"])
def test_hvdkits_optimizers_stepping_straight_after_an_async_save_wait_for_the_copy_and_leave_the_state_at_save(
    ranks, kind
):
    first = ranks[0]["step_after_save"][kind]
    assert first["copying_when_save_returned"] is True  # before: save() copied everything itself
    assert first["events"] == ["copy released", "copied", "step done"]  # the step waited for the copy
    assert first["same_arrays"] is True  # the state at save time, byte for byte as the sync save wrote it
    for r in ranks:
        assert r["step_after_save"][kind]["changed"]
    assert ranks[1]["step_after_save"][kind]["events"] == ["step done"]  # rank 1 copies nothing
