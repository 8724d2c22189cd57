"""Runs on every rank of a real 2-rank job; writes what it observed to OUT/rank<r>.json.

Rank-0-only steps of a restore that fail must fail every rank (no rank left waiting), and a rank
whose model differs from rank 0's must fail every rank of ``broadcast_state``.
The pytest side is tests/distributed/test_restore_errors.py. Usage: python restore_errors.py OUT
"""

import os
import shutil
import sys
import time

import torch
from recording import error_of, write_rank_result

import hvdkit.torch as hk
from hvdkit.core import CheckpointError, CollectiveError


def break_on_rank0(ckpt_dir, how):
    """After the Checkpointer was made: turn its folder into something rank 0 cannot list."""
    if hk.rank() == 0:
        shutil.rmtree(ckpt_dir)
        if how == "file":
            with open(ckpt_dir, "w") as f:
                f.write("not a folder")
        else:  # a symbolic link to itself: listing it fails with ELOOP, even for root
            os.symlink(os.path.basename(ckpt_dir), ckpt_dir)
    hk.communicator().barrier()


def section_unlistable_folder(out_dir, how):
    ckpt_dir = os.path.join(out_dir, f"ckpt-{how}")
    model = torch.nn.Linear(3, 2)
    ckpt = hk.Checkpointer(ckpt_dir, model, torch.optim.SGD(model.parameters(), lr=0.1))
    break_on_rank0(ckpt_dir, how)
    t0 = time.monotonic()
    error = error_of(ckpt.restore, CheckpointError)
    return {"error": error, "seconds": time.monotonic() - t0}


def section_mismatched_model(rank):
    model = torch.nn.Linear(3, 2 if rank == 0 else 4)
    return {"error": error_of(lambda: hk.broadcast_state(model), CollectiveError)}


def main(out_dir):
    topo = hk.init()
    result = {
        "rank": topo.rank,
        "file": section_unlistable_folder(out_dir, "file"),
        "loop": section_unlistable_folder(out_dir, "loop"),
        "mismatched_model": section_mismatched_model(topo.rank),
    }
    write_rank_result(out_dir, topo.rank, result)


if __name__ == "__main__":
    main(sys.argv[1])
