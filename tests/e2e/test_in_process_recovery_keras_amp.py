"""In-process recovery for Keras mixed precision (`hk.elastic.fit` of a `mixed_float16` model under `hvdkit run
--recovery in-process`): a worker killed mid-epoch, the survivor goes back to the last commit with the loss scale
of that commit, trains alone with 2 accumulated batches per step (the loss scale counting optimizer steps, not
batches), a new worker joins, and the run ends with the weights and the loss scale of an uninterrupted run.

Real ranks as in test_in_process_recovery_keras.py (its helpers), the same script with `--mixed-precision`:
hk.DistributedOptimizer's loss-scale optimizer with a dynamic scale from 1 that doubles after every 5 good steps
(the digits MLP does not overflow below 2**13, so it doubles 13 times in the 69 steps and ends at 2**13 with 4 good
steps counted since). Before hk.elastic accepted a loss-scale optimizer, both runs failed at once with ConfigError.
"""

import re

import pytest
from elastic_jobs import assert_every_sample_once_per_epoch, last_generation
from helpers import PYTHON, hvdkit_run, read_sample_logs
from test_in_process_recovery_keras import (
    EPOCHS,
    IN_PROCESS,
    SCRIPT,
    STEPS_PER_EPOCH,
    TRAIN_SAMPLES,
    imports_from_this_tree,
    result,
    weights,
    worst_difference,
)

pytestmark = pytest.mark.dist
SCALE = (2.0**13, 4)  # 69 good steps: doubled after 5 x 13 of them, 4 counted since


def loss_scales(text):
    """{rank: (loss scale, good steps counted)} as every rank printed it at the end."""
    found = re.findall(r"keras_elastic_fit: rank (\d) ends with loss scale (\S+) after (\d+) good steps", text)
    return {int(r): (float(s), int(g)) for r, s, g in found}


def test_a_mixed_precision_keras_worker_killed_mid_epoch_is_recovered_in_process_with_the_loss_scale_of_its_commit(
    tmp_path,
):
    ref_out = tmp_path / "ref"
    ref = hvdkit_run("-np", "2", "--gloo", "--", PYTHON, SCRIPT, str(ref_out), "--mixed-precision", timeout=300)
    text = ref.stdout + ref.stderr
    assert ref.returncode == 0, text[-4000:]
    assert imports_from_this_tree(text, 2)
    assert loss_scales(text) == {0: SCALE, 1: SCALE}, text[-4000:]  # the known answer: it never overflowed
    reference = {"weights": weights(ref_out, 0), "result": result(text)}

    out, log, marker = tmp_path / "weights", tmp_path / "samples", tmp_path / "killed"
    proc = hvdkit_run(
        *IN_PROCESS, "--", PYTHON, SCRIPT, str(out), "--mixed-precision", "--sample-log", str(log),
        "--kill", f"{marker}:1:33", "--wait-for-join", timeout=400,
    )  # fmt: skip
    text = proc.stdout + proc.stderr
    assert proc.returncode == 0, text[-6000:]
    assert marker.exists() and "rank 1 kills itself after step 33" in text  # mid-epoch 2, after the scale doubled 6x
    assert imports_from_this_tree(text, 3)  # the two first workers and the one that joined
    events = re.findall(r"(a worker was lost|workers join): (\d+ -> \d+) ranks, going on from step (\d+)", text)
    assert [e[:2] for e in events] == [("a worker was lost", "2 -> 1"), ("workers join", "1 -> 2")], text[-6000:]
    resumed, joined = int(events[0][2]), int(events[1][2])
    assert resumed == 30 and joined > resumed, events  # the commit of step 30 (a commit every 5 steps)
    assert "restarting" not in text and text.count("2 rank(s) over Gloo") == 1  # no relaunch of the job
    got = result(text)
    assert got["steps"] == EPOCHS * STEPS_PER_EPOCH and got["size"] == 2 and got["epochs"] == [0, 1, 2]
    # steps 31 .. the join trained at 1 rank, 2 batches of 32 accumulated per step
    records = read_sample_logs(log)
    alone = sorted(s for (_, s), rs in last_generation(records).items() if rs[-1]["size"] == 1)
    assert alone == list(range(resumed + 1, joined + 1)) and alone, alone
    assert_every_sample_once_per_epoch(records, EPOCHS, TRAIN_SAMPLES, STEPS_PER_EPOCH)
    # both ranks (the survivor and the one that joined) end with the uninterrupted run's loss scale and good-step
    # count, and its weights, bitwise
    assert loss_scales(text) == {0: SCALE, 1: SCALE}, text[-6000:]
    mine = weights(out, 0)
    assert worst_difference(mine, weights(out, 1)) == 0.0
    assert worst_difference(mine, reference["weights"]) == 0.0
    assert got["val_loss"] == reference["result"]["val_loss"]
    assert got["val_accuracy"] == reference["result"]["val_accuracy"]
