"""Kill a checkpoint writer at random points: loading must always give the newest complete
checkpoint and never anything partial. Real processes, real SIGKILL; no MPI needed, except for the
background (``async_save``) write killed in a real 2-rank job."""

import itertools
import json
import os
import random
import signal
import subprocess
import sys
import time

import pytest
from checkpoint_files import read
from helpers import PYTHON, ROOT, record_figures, run_bounded, run_ranks

from hvdkit.core import CheckpointError, CheckpointStore, LocalCommunicator
from hvdkit.core.checkpoint import verify
from hvdkit.core.checkpoint.folder import listing

sys.path.insert(0, str(ROOT / "tests" / "e2e" / "scripts"))
from checkpoint_writer import RESAVED_STEP, payload, writer  # noqa: E402

WRITER = str(ROOT / "tests" / "e2e" / "scripts" / "checkpoint_writer.py")
TRIALS = 24


def kill_writer(root, rng, in_rename_window):
    proc = subprocess.Popen(
        [PYTHON, WRITER, str(root), "0.3" if in_rename_window else "0"], stdout=subprocess.PIPE, text=True
    )
    saved = []
    try:
        if in_rename_window:
            for line in proc.stdout:  # the first RENAMING after at least one save in this trial
                if line.startswith("SAVED"):
                    saved.append(int(line.split()[1]))
                elif saved and line.startswith("RENAMING"):
                    break
        else:
            time.sleep(rng.uniform(0.3, 1.2))  # somewhere in writing, fsync, rename or pruning
    finally:
        proc.send_signal(signal.SIGKILL)
        out, _ = proc.communicate()
    saved += [int(line.split()[1]) for line in out.splitlines() if line.startswith("SAVED")]
    return saved


def newest_complete(root):
    """The step of the newest checkpoint under ``root`` that verifies, found without the store's lock."""
    for _, _, path in listing(root):
        try:
            return int(verify(path)["step"])
        except CheckpointError:  # a broken one simply does not count
            continue
    return None


def test_killing_the_writer_anywhere_never_loses_a_saved_checkpoint_or_loads_a_partial_one(tmp_path):
    rng = random.Random(1234)
    root = tmp_path / "ckpt"
    last_reported = 0
    outcomes = {"rename_window": 0, "random": 0, "leftover_partial": 0}
    for trial in range(TRIALS):
        in_window = trial % 3 == 0
        saved = kill_writer(root, rng, in_window)
        outcomes["rename_window" if in_window else "random"] += 1
        last_reported = max([last_reported, *saved])
        outcomes["leftover_partial"] += any(n.startswith(".tmp-") for n in os.listdir(root))
        loaded = CheckpointStore(root, LocalCommunicator(), keep=3).load(read)
        assert loaded is not None
        state, info = loaded
        assert state == payload(info.step)  # the content is that step's, whole
        assert info.step == newest_complete(root)  # the newest complete one, not an older one
        assert info.step >= last_reported  # nothing the writer reported as saved was lost
    assert outcomes["rename_window"] == 8 and outcomes["leftover_partial"] >= 8  # the window was really hit
    record_figures("checkpoint_writer_killed", trials=TRIALS, **outcomes, partial_loads=0, saved_checkpoints_lost=0)


def test_killing_a_resave_of_the_newest_step_at_every_operation_never_loses_that_step(tmp_path):
    # keep=1 and step 5 saved again (a resumed run reaching the step it was preempted at): the
    # writer SIGKILLs itself right before the k-th rename/fsync/mkdir/unlink/rmdir of the second save,
    # for k = 1, 2, ... until the save completes. After each kill the next job opens the folder
    # (taking the lock and sweeping what the dead one left), must load step 5 whole, and saves it again.
    outcomes = {"kill_points": 0, "loaded_first_copy": 0, "loaded_second_copy": 0, "leftovers_swept": 0}
    for kill_at in itertools.count(1):
        root = tmp_path / f"kill-at-{kill_at}"
        proc = run_bounded([PYTHON, WRITER, str(root), "resave", str(kill_at)], timeout=120)
        if proc.returncode == 0:
            assert "DONE after" in proc.stdout and kill_at > 8, proc.stdout  # every point was reached
            break
        assert proc.returncode == -signal.SIGKILL and "KILLED before operation" in proc.stdout, (
            proc.stdout + proc.stderr
        )
        outcomes["kill_points"] += 1
        leftovers = any(n.startswith(".tmp-") for n in os.listdir(root))
        store = CheckpointStore(root, LocalCommunicator(), keep=1)
        loaded = store.load(read)
        assert loaded is not None, f"step {RESAVED_STEP} lost when killed at {proc.stdout.splitlines()[-1]}"
        state, info = loaded
        assert info.step == RESAVED_STEP and state in (payload(RESAVED_STEP), payload(RESAVED_STEP, 1)), kill_at
        outcomes["loaded_second_copy" if state == payload(RESAVED_STEP, 1) else "loaded_first_copy"] += 1
        store.save(writer(RESAVED_STEP, 2), RESAVED_STEP, 1)  # the resumed job reaches the step again
        store.wait_for_cleanup()
        outcomes["leftovers_swept"] += leftovers
        assert [n for n in os.listdir(root) if n != ".hvdkit.lock"] == [f"ckpt-{RESAVED_STEP:012d}"]
        assert store.load(read)[0] == payload(RESAVED_STEP, 2)
    assert outcomes["loaded_first_copy"] > 0 and outcomes["loaded_second_copy"] > 0  # both sides of the swap hit
    record_figures("checkpoint_resave_killed", **outcomes, steps_lost=0)


ASYNC_KILL = str(ROOT / "tests" / "e2e" / "scripts" / "async_checkpoint_kill.py")


@pytest.mark.dist
def test_killing_rank_0_during_a_background_write_keeps_the_previous_checkpoint_and_resumes_from_it(tmp_path):
    # A real 2-rank job saves steps 1 and 2 with async_save, then step 3: save() returns, the ranks
    # train on, and rank 0's write thread SIGKILLs the process right before it would rename the
    # finished step-3 folder into place. A fresh 2-rank job must resume from step 2, bitwise, and
    # redo step 3 exactly as the killed job computed it.
    ckpt, out = tmp_path / "ckpt", tmp_path / "out"
    out.mkdir()
    killed = run_ranks("mpirun", 2, [ASYNC_KILL, "kill", str(ckpt), str(out)], timeout=240)
    assert killed.returncode != 0 and "NOT KILLED" not in killed.stdout, killed.stdout[-2000:]
    kill = json.loads((out / "kill.json").read_text())
    assert kill["returned_path"] == "ckpt-000000000003" and kill["trained_on_to"] >= 4  # it went on training
    in_flight = [n for n in kill["listing_at_kill"] if n.startswith(".tmp-") and "-ckpt-000000000003-" in n]
    assert len(in_flight) == 1 and "ckpt-000000000003" not in kill["listing_at_kill"]
    resumed = run_ranks("mpirun", 2, [ASYNC_KILL, "resume", str(ckpt), str(out)], timeout=240)
    assert resumed.returncode == 0, resumed.stdout[-2000:] + resumed.stderr[-4000:]
    for r in (0, 1):
        rec = json.loads((out / f"resume-rank{r}.json").read_text())
        assert rec["before"] != kill["digests"]["2"]  # a fresh model: the restore moved it
        assert rec["resumed"] == [2, {"step": 2}] and rec["restored"] == kill["digests"]["2"]
        assert rec["step_after"] == kill["digests"]["3"]  # the resumed run continues exactly
        assert rec["listing"] == [".hvdkit.lock", *(f"ckpt-00000000000{s}" for s in (1, 2, 3))]  # leftover swept
    record_figures("checkpoint_async_write_killed", resumed_step=2, partial_loads=0, saved_checkpoints_lost=0)
