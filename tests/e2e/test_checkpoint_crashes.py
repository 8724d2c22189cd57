"""Kill a checkpoint writer at random points: loading must always give the newest complete
checkpoint and never anything partial. Real processes, real SIGKILL; no MPI needed."""

import os
import random
import signal
import subprocess
import sys
import time

from helpers import PYTHON, ROOT, record_figures
from hvdkit.core import CheckpointStore, LocalCommunicator
from hvdkit.core.checkpoint import verify

sys.path.insert(0, str(ROOT / "tests" / "e2e" / "scripts"))
from checkpoint_writer import payload  # noqa: E402

WRITER = str(ROOT / "tests" / "e2e" / "scripts" / "checkpoint_writer.py")
TRIALS = 24


def read(folder):
    with open(os.path.join(folder, "state.bin"), "rb") as f:
        return f.read()


def kill_writer(root, rng, in_rename_window):
    proc = subprocess.Popen([PYTHON, WRITER, str(root), "0.3" if in_rename_window else "0"],
                            stdout=subprocess.PIPE, text=True)
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
    steps = []
    for name in os.listdir(root):
        if name.startswith("ckpt-"):
            try:
                steps.append(int(verify(os.path.join(root, name))["step"]))
            except Exception:  # noqa: BLE001 - a broken one simply does not count
                continue
    return max(steps) if steps else None


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
