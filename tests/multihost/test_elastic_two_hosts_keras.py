"""Elastic training by restart on two real hosts with the Keras example (``model.fit``, epoch
granularity): the torch test of test_elastic_two_hosts.py, done for Keras.

`hvdkit run -np 2 --min-np 1 --max-np 2` trains examples/keras_digits.py across hosts a and b with
the global batch kept constant and no compression. Host b dies mid-epoch (link down, processes
killed): the job relaunches on a alone, which resumes at the newest epoch checkpoint; b comes back:
the launcher asks a to stop, which it does at its next epoch end (the Keras example checks its
PreemptionGuard there only), and the job grows back to 2 and finishes. It ends within 1e-5 of an
uninterrupted 2-rank run, and the per-sample logs show every sample used exactly once per epoch.
Needs root (namespaces, mounts).
"""

import numpy as np
import pytest
from helpers import PYTHON, ROOT, record_figures
from netns import NEEDS_HOSTS, open_hosts
from test_elastic_two_hosts import (
    _changes,
    check_every_sample_once,
    check_shrunk_and_grew,
    job_fixtures,
    record_change_figures,
)

pytestmark = [
    pytest.mark.dist,
    pytest.mark.timeout(900),
    *NEEDS_HOSTS,
]
EXAMPLE = str(ROOT / "examples" / "keras_digits.py")
# 45 steps an epoch: long enough for b to die mid-epoch, not only at an epoch end
EPOCHS = (
    4  # b dies in epoch 2; a alone, held until the launcher asks it to stop, ends that epoch; the last run at 2 again
)
TRAIN = [
    PYTHON,
    EXAMPLE,
    "--epochs",
    str(EPOCHS),
    "--batch-size",
    "16",
    "--global-batch-size",
    "32",
    "--compression",
    "none",
]


@pytest.fixture(scope="module")
def hosts():
    yield from open_hosts(prefix="hvdq")  # names of its own, apart from the torch test's "hvde" hosts


def final_weights(folder):
    """The model weights of the newest checkpoint in ``folder``, by position (``model/<i>``)."""
    from hvdkit.core.checkpoint.state import read_newest

    return {f"model/{i}": a for i, a in enumerate(read_newest(folder).state["model"])}


# in `elastic` the example reports its steps from fit's start (PreemptionGuard.progress): the launcher
# asks as soon as a alone trains, and a stops at the end of that epoch
uninterrupted, elastic = job_fixtures(TRAIN, EXAMPLE, "keras", uninterrupted_timeout=500)


def test_the_keras_job_shrinks_to_host_a_when_b_dies_and_grows_back_when_b_returns(elastic):
    result = check_shrunk_and_grew(elastic, EPOCHS)
    assert 0 < result["resumed_from_epoch"] < EPOCHS  # the last attempt resumed at an epoch boundary


def test_every_sample_is_used_exactly_once_per_epoch_across_the_keras_changes(elastic, uninterrupted):
    steps, recomputed = check_every_sample_once(elastic, uninterrupted, EPOCHS)
    sizes = {records[0]["epoch"]: records[0]["size"] for _, records in sorted(steps.items())}
    per_epoch = {}
    for _, records in steps.items():  # epoch granularity: one world size for all of an epoch's steps
        per_epoch.setdefault(records[0]["epoch"], set()).add(records[0]["size"])
    assert all(len(s) == 1 for s in per_epoch.values()), per_epoch
    assert 1 in sizes.values() and sizes[0] == sizes[EPOCHS - 1] == 2, sizes
    assert recomputed > 0  # b died mid-epoch: a alone trained again the steps of the epoch it was in
    figures = {c["kind"]: c for c in _changes(elastic["log"])}
    # the summary counts the steps of the epoch b died in (reported at each batch end) as redone;
    # the grow stops at an epoch end, where the checkpoint is: nothing redone
    assert figures["grow"]["recomputed"] == 0 and 0 < figures["shrink"]["recomputed"] <= recomputed, (
        figures,
        recomputed,
    )
    record_change_figures(
        "elastic: host b dies mid-epoch, comes back (keras fit, 2 hosts, min 1 max 2)",
        figures,
        recomputed,
        world_size_per_epoch=[sizes[e] for e in range(EPOCHS)],
        job_seconds=round(elastic["seconds"], 1),
    )


def test_the_final_keras_weights_match_an_uninterrupted_two_rank_run(elastic, uninterrupted):
    got, want = final_weights(elastic["work"] / "c"), final_weights(uninterrupted / "c")
    assert sorted(got) == sorted(want) and want
    worst = max(float(np.max(np.abs(got[k] - want[k]))) for k in want)
    record_figures("elastic keras: final weights against an uninterrupted run", max_abs_difference=worst)
    assert worst <= 1e-5, worst
