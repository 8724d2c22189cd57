"""torch checkpoints on 2 real ranks: ``extra`` that would not come back as it was at resume is a
ConfigError on every rank at save time, naming key path and type; nothing is written. Before the
check, such a save succeeded and every checkpoint of the run was unloadable."""

import pytest
from helpers import ROOT, run_contract_worker

pytestmark = pytest.mark.dist
WORKER = ROOT / "tests" / "distributed" / "workers" / "checkpoint_extra_torch.py"


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    return run_contract_worker("mpirun", WORKER, tmp_path_factory.mktemp("extra"), timeout=300)


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
