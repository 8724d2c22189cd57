"""In-process recovery for Keras `model.fit` (`hk.elastic.fit` under `hvdkit run --recovery in-process`): a worker
killed mid-epoch (rank 1, or rank 0: then the rank left becomes rank 0 and goes on checkpointing), the job goes on in
the process that is left from its last in-memory commit, a new worker joins and gets the state, and the run ends as
an uninterrupted one.

Real ranks: Horovod's elastic driver over Gloo, one host (`localhost:2`; engine fix 09 starts a new worker in the
lost one's slot), real TensorFlow/Keras. The script (scripts/keras_elastic_fit.py): the digits MLP, global batch
64 = 32 per rank (1 rank: 2 accumulation steps), a commit every 5 optimizer steps and at every epoch end.
"""

import json
import re
import signal

import numpy as np
import pytest
from elastic_jobs import assert_every_sample_once_per_epoch, last_generation
from helpers import PYTHON, ROOT, hvdkit_run, pid_running, read_sample_logs

from hvdkit.core.checkpoint.state import read_newest

pytestmark = pytest.mark.dist
SCRIPT = str(ROOT / "tests" / "e2e" / "scripts" / "keras_elastic_fit.py")
EPOCHS, TRAIN_SAMPLES, STEPS_PER_EPOCH = 3, 1437, 23  # global batch 64
BOUND = 1e-5  # the bound a restart at another world size holds (tests/distributed/test_world_size_change_keras.py)
# An epoch with a recovery logs its loss within this relative bound of the uninterrupted run's: its batches at 1 rank
# train weights within BOUND of those at 2 ranks, and the committed state of 2 ranks, summed into 1 rank's float32
# accumulators, is rounded once more. Its accuracy (counts of right answers) is the same.
METRIC_BOUND = 1e-5
IN_PROCESS = ("-np", "2", "--min-np", "1", "--max-np", "2", "--recovery", "in-process")


def result(out):
    (line,) = re.findall(r"keras_elastic_fit: (\{.*\})$", out, re.M)
    return json.loads(line)


def weights(prefix, rank):
    with np.load(f"{prefix}.rank{rank}.npz") as f:
        return [f[k] for k in sorted(f.files, key=lambda k: int(k.split("_")[1]))]


def worst_difference(a, b):
    assert [w.shape for w in a] == [w.shape for w in b]
    return max(float(np.max(np.abs(x.astype(np.float64) - y.astype(np.float64)))) for x, y in zip(a, b, strict=True))


def worst_relative_difference(got, ref):
    """The History's logged metrics of two runs: the same names and epochs; the largest relative difference."""
    assert sorted(got) == sorted(ref) == ["accuracy", "loss"] and all(len(got[k]) == len(ref[k]) for k in ref)
    return max(abs(a - b) / abs(b) for k in ref for a, b in zip(got[k], ref[k], strict=True))


def imports_from_this_tree(out, processes):
    found = re.findall(r"keras_elastic_fit: process (\d+) imports hvdkit from (\S+)", out)
    assert len({p for p, _ in found}) == processes, out[-3000:]
    return all(path.startswith(str(ROOT / "hvdkit")) for _, path in found)


def lost_then_joined(text):
    """The job's output after one kill at step 33: the survivor went back to the commit of step 30 at 1 rank, a
    new worker joined at a later commit, the job was never relaunched and ended at 2 ranks after every epoch.
    (step it resumed from, step it was joined at, the script's result)."""
    events = re.findall(r"(a worker was lost|workers join): (\d+ -> \d+) ranks, going on from step (\d+)", text)
    assert [e[:2] for e in events] == [("a worker was lost", "2 -> 1"), ("workers join", "1 -> 2")], text[-6000:]
    resumed, joined = int(events[0][2]), int(events[1][2])
    assert resumed == 30 and joined > resumed, events
    assert "restarting" not in text and text.count("2 rank(s) over Gloo") == 1  # no relaunch of the job
    got = result(text)
    assert got["steps"] == EPOCHS * STEPS_PER_EPOCH and got["size"] == 2 and got["epochs"] == [0, 1, 2]
    return resumed, joined, got


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    """The same script on 2 ranks, uninterrupted and outside in-process recovery: hk.elastic.fit is one plain fit."""
    out = tmp_path_factory.mktemp("keras-ref") / "weights"
    proc = hvdkit_run("-np", "2", "--gloo", "--", PYTHON, SCRIPT, str(out), timeout=300)
    text = proc.stdout + proc.stderr
    assert proc.returncode == 0, text[-4000:]
    assert imports_from_this_tree(text, 2)
    return {"weights": weights(out, 0), "result": result(text)}


def test_a_keras_worker_killed_mid_epoch_is_recovered_in_process_a_new_one_joins_and_the_run_ends_as_without_the_kill(
    uninterrupted, tmp_path
):
    out, log, marker = tmp_path / "weights", tmp_path / "samples", tmp_path / "killed"
    proc = hvdkit_run(
        *IN_PROCESS, "--", PYTHON, SCRIPT, str(out), "--sample-log", str(log), "--kill", f"{marker}:1:33",
        "--wait-for-join", timeout=400,
    )  # fmt: skip
    text = proc.stdout + proc.stderr
    assert proc.returncode == 0, text[-6000:]
    assert marker.exists() and "rank 1 kills itself after step 33" in text  # the kill happened, mid-epoch 2
    assert imports_from_this_tree(text, 3)  # the two first workers and the one that joined
    # rank 1 died after step 33, before a commit: the survivor went back to step 30 (a commit every 5 steps, in
    # mid-epoch: 7 of epoch 2's 23 steps), at 1 rank; the new worker joined at a later commit (step 35, unless its
    # notice reached the survivor's state a few steps after the script's wait saw it)
    resumed, joined, got = lost_then_joined(text)
    commits = {s for s in range(35, EPOCHS * STEPS_PER_EPOCH) if s % 5 == 0 or s % STEPS_PER_EPOCH == 0}
    assert joined in commits, (resumed, joined)
    records = read_sample_logs(log)
    final = last_generation(records)
    # the steps from the recovery to the join trained at 1 rank (2 batches of 32 accumulated), the others at 2
    alone = sorted(s for (_, s), rs in final.items() if rs[-1]["size"] == 1)
    assert alone == list(range(resumed + 1, joined + 1))
    assert all(
        len(r["indices"]) == 64 for (_, s), rs in final.items() if s in alone and s % STEPS_PER_EPOCH for r in rs
    )
    assert_every_sample_once_per_epoch(records, EPOCHS, TRAIN_SAMPLES, STEPS_PER_EPOCH)
    # the new worker got the survivor's state: both ranks end bitwise equal, and equal to the uninterrupted run
    mine = weights(out, 0)
    assert worst_difference(mine, weights(out, 1)) == 0.0
    assert worst_difference(mine, uninterrupted["weights"]) <= BOUND
    assert abs(got["val_loss"] - uninterrupted["result"]["val_loss"]) <= 1e-4
    assert got["val_accuracy"] == uninterrupted["result"]["val_accuracy"]
    # epoch 2's logged metrics are those of its whole 1437 samples, as without the kill (before: of the batches
    # after the join only): the commit held both ranks' metric state, which the survivor and the joined worker added
    ref = uninterrupted["result"]["history"]
    assert got["history"]["accuracy"] == ref["accuracy"], (got["history"], ref)
    assert worst_relative_difference(got["history"], ref) <= METRIC_BOUND, (got["history"], ref)


def test_a_keras_zero1_worker_killed_mid_epoch_is_recovered_in_process_and_ends_as_the_unsharded_run(
    uninterrupted, tmp_path
):
    """ZeRO-1 (`--zero`: shard_optimizer_state=True): rank 1, which holds the momentum of half the elements, is
    SIGKILLed right after step 33. Every commit gathered the whole (unsharded) optimizer state to every rank, so the
    survivor goes back to the commit of step 30, cuts the slices anew for 1 rank (all of them, accumulating 2 batches
    a step for the fixed global batch), trains alone, and gives the new worker its slices at the join; the job is
    never relaunched, every sample is trained once per epoch, and the run ends within BOUND of the uninterrupted
    unsharded run (the module's reference). Before, hk.elastic.fit refused a sharded optimizer (ConfigError)."""
    out, log, marker = tmp_path / "weights", tmp_path / "samples", tmp_path / "killed"
    proc = hvdkit_run(
        *IN_PROCESS, "--", PYTHON, SCRIPT, str(out), "--sample-log", str(log), "--kill", f"{marker}:1:33",
        "--wait-for-join", "--zero", timeout=400,
    )  # fmt: skip
    text = proc.stdout + proc.stderr
    assert proc.returncode == 0, text[-6000:]
    assert marker.exists() and "rank 1 kills itself after step 33" in text
    assert imports_from_this_tree(text, 3)
    resumed, joined, got = lost_then_joined(text)
    # sharded at the end: each of the 2 ranks holds the momentum of half the 17,226 trainable elements
    held = sorted(int(n) for n in re.findall(r"keras_elastic_fit: rank \d holds (\d+) momentum elements", text))
    assert held == [8613, 8613], held
    records = read_sample_logs(log)
    alone = sorted(s for (_, s), rs in last_generation(records).items() if rs[-1]["size"] == 1)
    assert alone == list(range(resumed + 1, joined + 1))  # trained at 1 rank between the recovery and the join
    assert_every_sample_once_per_epoch(records, EPOCHS, TRAIN_SAMPLES, STEPS_PER_EPOCH)
    mine = weights(out, 0)
    assert worst_difference(mine, weights(out, 1)) == 0.0  # the all-gather gives every rank the same weights
    difference = worst_difference(mine, uninterrupted["weights"])
    print(f"zero1: largest difference to the uninterrupted unsharded run {difference:.3g}")
    assert difference <= BOUND
    assert abs(got["val_loss"] - uninterrupted["result"]["val_loss"]) <= 1e-4
    assert got["val_accuracy"] == uninterrupted["result"]["val_accuracy"]
    ref = uninterrupted["result"]["history"]
    assert got["history"]["accuracy"] == ref["accuracy"], (got["history"], ref)
    assert worst_relative_difference(got["history"], ref) <= METRIC_BOUND, (got["history"], ref)


def test_sigterm_to_hvdkit_run_stops_every_keras_rank_at_a_checkpointed_step_and_the_next_in_process_start_continues(
    uninterrupted, tmp_path
):
    """Preemption as Kubernetes does it (SIGTERM to `hvdkit run`, which passes it on to the local workers): after
    rank 1's step 26 (epoch 2, steps 24-46) the script sends it. hk.elastic.fit's guard must stop every rank after
    the same step, the hk.CheckpointCallback write that step with its sample offset, every rank exit 0 and the job
    exit 143 leaving no process; the next in-process start must go on from that step (restored before its first
    commit) and end as the uninterrupted run. Before, SIGTERM ended the workers where they were (exit 143 without
    a clean stop and no checkpoint of the step), and a new start trained from epoch 0 again."""
    d, log, out = tmp_path / "ckpt", tmp_path / "samples", tmp_path / "weights"
    args = ("--checkpoint-dir", str(d), "--sample-log", str(log))
    proc = hvdkit_run(
        *IN_PROCESS, "--", PYTHON, SCRIPT, str(out), *args, "--term", f"{tmp_path / 'termed'}:1:26", "--pace", "0.1",
        timeout=300,
    )  # fmt: skip
    text = proc.stdout + proc.stderr
    assert (tmp_path / "termed").exists() and "rank 1 preempts the job after step 26" in text, text[-6000:]
    assert proc.returncode == 128 + signal.SIGTERM, text[-6000:]
    assert "stopped by SIGTERM: every rank exited cleanly" in text, text[-6000:]
    stops = {int(r): int(s) for r, s in re.findall(r"keras_elastic_fit: rank (\d) of 2 stopped after step (\d+)", text)}
    assert sorted(stops) == [0, 1] and len(set(stops.values())) == 1, text[-6000:]  # every rank after the same step
    (step,) = set(stops.values())
    assert 26 <= step < 2 * STEPS_PER_EPOCH, text[-6000:]  # mid-epoch 2
    got = result(text)
    assert got["stopped"] is True and got["steps"] == step and got["epochs"] == [0]
    newest = read_newest(d)  # the checkpoint of that step, with the epoch's global sample offset
    assert newest.step == step and newest.epoch == 1, (newest.step, newest.epoch)
    assert newest.extra["samples_done"] == (step - STEPS_PER_EPOCH) * 64 and sorted(newest.extra["history"]) == [0]
    assert "a worker was lost" not in text and text.count("2 rank(s) over Gloo") == 1  # nothing taken for a failure
    (listed,) = re.findall(r"kill_in_process: SIGTERM to hvdkit run \d+; below it: ([\d ]+)$", text, re.M)
    workers = [int(p) for p in re.findall(r"keras_elastic_fit: process (\d+) imports hvdkit", text)]
    assert len(workers) == 2 and set(workers) <= {int(p) for p in listed.split()}, text[-6000:]
    assert [p for p in map(int, listed.split()) if pid_running(p)] == []
    assert imports_from_this_tree(text, 2)
    # the next start, in-process again, goes on from that step and ends as the uninterrupted run
    again = hvdkit_run(*IN_PROCESS, "--", PYTHON, SCRIPT, str(out), *args, timeout=300)
    text = again.stdout + again.stderr
    assert again.returncode == 0, text[-6000:]
    assert f"resumed from {newest.path} (step {step}, epoch 1)" in text, text[-6000:]
    got = result(text)
    assert got["stopped"] is False and got["resumed_from_epoch"] == 1
    assert got["steps"] == EPOCHS * STEPS_PER_EPOCH and got["epochs"] == [0, 1, 2]  # the History of the whole run
    assert read_newest(d).step == EPOCHS * STEPS_PER_EPOCH
    assert_every_sample_once_per_epoch(read_sample_logs(log), EPOCHS, TRAIN_SAMPLES, STEPS_PER_EPOCH)
    # at the same size, from a checkpoint of every weight and optimizer variable: bitwise the uninterrupted run
    mine = weights(out, 0)
    assert worst_difference(mine, weights(out, 1)) == 0.0
    assert worst_difference(mine, uninterrupted["weights"]) == 0.0
    assert abs(got["val_loss"] - uninterrupted["result"]["val_loss"]) <= 1e-4
    assert got["val_accuracy"] == uninterrupted["result"]["val_accuracy"]
    # every epoch's logged metrics, the resumed epoch 2's too, bitwise the uninterrupted run's (before: epoch 2's
    # covered the batches after the resume only): the checkpoint held each rank's metric state, which each rank
    # added back at the same size
    assert got["history"] == uninterrupted["result"]["history"], (got["history"], uninterrupted["result"]["history"])


def test_rank_0_killed_mid_epoch_the_rank_left_becomes_rank_0_goes_on_checkpointing_and_the_run_ends_as_without_it(
    uninterrupted, tmp_path
):
    """Rank 0 SIGKILLed right after step 33 (mid-epoch 2, before the commit of step 35), with an
    hk.CheckpointCallback: rank 1, left alone, becomes rank 0, goes back to the commit of step 30 and trains on; the
    new worker joins at a later commit; the job is never relaunched. The checkpoints after the kill (the ends of
    epochs 2 and 3) are written by the process that was rank 1, which holds the folder's lock once its holder died."""
    d, out, log, marker = tmp_path / "ckpt", tmp_path / "weights", tmp_path / "samples", tmp_path / "killed"
    proc = hvdkit_run(
        *IN_PROCESS, "--", PYTHON, SCRIPT, str(out), "--sample-log", str(log), "--kill", f"{marker}:0:33",
        "--wait-for-join", "--checkpoint-dir", str(d), timeout=400,
    )  # fmt: skip
    text = proc.stdout + proc.stderr
    assert proc.returncode == 0, text[-6000:]
    (killed,) = map(int, re.findall(r"rank 0 kills itself after step 33 \(process (\d+)\)", text))
    assert marker.exists() and imports_from_this_tree(text, 3)
    resumed, joined, got = lost_then_joined(text)
    assert_every_sample_once_per_epoch(read_sample_logs(log), EPOCHS, TRAIN_SAMPLES, STEPS_PER_EPOCH)
    # the process that was rank 1 ends as rank 0 (the joined one is rank 1), and it took the folder's lock after the
    # kill: after the killed rank 0 wrote epoch 1's checkpoint, before epoch 2's
    first = [int(p) for p in re.findall(r"keras_elastic_fit: process (\d+) imports hvdkit", text)][:2]
    (survivor,) = set(first) - {killed}
    ends = {
        int(p): (int(r), int(n))
        for p, r, n in re.findall(r"keras_elastic_fit: process (\d+) ends as rank (\d) of (\d)", text)
    }
    assert ends[survivor] == (0, 2) and len(ends) == 2 and killed not in ends, (ends, survivor, killed)
    # it said so once, when it became rank 0 (before, nothing said who writes the checkpoints now)
    took_over = re.findall(
        r"rank 0 is now process (\d+) \(was rank (\d)\): it writes the checkpoints from step (\d+)", text
    )
    assert took_over == [(str(survivor), "1", str(resumed))], (took_over, text[-6000:])
    holder = json.loads((d / ".hvdkit.lock").read_text())
    assert holder["pid"] == survivor, holder
    created = {
        int(p.name.split("-")[1]): json.loads((p / "manifest.json").read_text())["created"] for p in d.glob("ckpt-*")
    }
    assert sorted(created) == [STEPS_PER_EPOCH, 2 * STEPS_PER_EPOCH, 3 * STEPS_PER_EPOCH], sorted(created)
    assert created[STEPS_PER_EPOCH] < holder["since"] <= created[2 * STEPS_PER_EPOCH], (holder, created)
    # the newest checkpoint, after the kill, reads back (checksums verified) as the run's end, at 2 ranks
    newest = read_newest(d)
    assert (newest.step, newest.epoch, newest.world_size) == (3 * STEPS_PER_EPOCH, 3, 2) and newest.step > 33
    mine = weights(out, 0)
    assert worst_difference([np.asarray(a) for a in newest.state["model"]], mine) == 0.0
    # both ranks end bitwise equal, and equal to the uninterrupted run
    assert worst_difference(mine, weights(out, 1)) == 0.0
    assert worst_difference(mine, uninterrupted["weights"]) == 0.0
    assert abs(got["val_loss"] - uninterrupted["result"]["val_loss"]) <= 1e-4
    assert got["val_accuracy"] == uninterrupted["result"]["val_accuracy"]
    # the recovered epoch 2 logs the metrics of the whole epoch, as without the kill (see the test above)
    ref = uninterrupted["result"]["history"]
    assert got["history"]["accuracy"] == ref["accuracy"], (got["history"], ref)
    assert worst_relative_difference(got["history"], ref) <= METRIC_BOUND, (got["history"], ref)
