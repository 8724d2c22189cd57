"""A torch job that checkpoints into DIR, for the two-jobs-on-one-folder test (run on real ranks).

    checkpoint_job.py DIR OUT holder   saves steps 1-2 (keep=2), writes OUT/holding (rank 0's
                                       host and pid), waits for OUT/release, saves steps 3-5
    checkpoint_job.py DIR OUT second   opens DIR as well (keep=1) and saves step 10: records
                                       what every rank gets, re-raises

Each rank records what it saw in OUT/<role>-rank<r>.json.
"""

import json
import os
import socket
import sys
import time

import torch

import hvdkit.torch as hk
from hvdkit.core import CheckpointError

WAIT_S = 300


def record(out, name, data):
    with open(os.path.join(out, f"{name}-rank{hk.rank()}.json"), "w") as f:
        json.dump(data, f)


def holder(directory, out, model):
    ckpt = hk.Checkpointer(directory, model, keep=2)
    saved = [ckpt.save(step, epoch=0, extra={"step": step}) for step in (1, 2)]
    if hk.rank() == 0:
        with open(os.path.join(out, "holding"), "w") as f:
            json.dump({"host": socket.gethostname(), "pid": os.getpid()}, f)
    deadline = time.monotonic() + WAIT_S
    while not os.path.exists(os.path.join(out, "release")) and time.monotonic() < deadline:
        time.sleep(0.1)
    saved += [ckpt.save(step, epoch=0, extra={"step": step}) for step in (3, 4, 5)]
    record(out, "holder", {"saved": [os.path.basename(p) for p in saved]})


def second(directory, out, model):
    t0 = time.perf_counter()
    try:
        ckpt = hk.Checkpointer(directory, model, keep=1)
    except CheckpointError as e:
        record(out, "second", {"error": str(e), "seconds": time.perf_counter() - t0})
        raise
    ckpt.save(10, epoch=0)  # what a second job would do next (and, unlocked, prune the first's)
    record(out, "second", {"error": None})


def main(directory, out, role):
    hk.init()
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    hk.broadcast_state(model)
    (holder if role == "holder" else second)(directory, out, model)


if __name__ == "__main__":
    main(*sys.argv[1:4])
