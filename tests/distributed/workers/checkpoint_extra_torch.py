"""Runs on every rank of a real 2-rank job: what torch checkpoints do with ``extra`` that would not
come back as it was at resume. Writes OUT/rank<r>.json.

Rank 0's ``extra`` is the bad one, rank 1 passes None: rank 0's finding must reach rank 1 too.
Usage: python checkpoint_extra_torch.py OUT
"""

import os
import pathlib
import sys

import numpy as np
import torch
from recording import error_of, write_rank_result

import hvdkit.torch as hk
from hvdkit.core import ConfigError

BAD = {
    "np_float64": {"best_loss": np.float64(0.25)},
    "np_int64": {"seen": [1, {"batches": np.int64(2)}]},
    "ndarray": {"weights": np.arange(3.0)},
    "path": {"data": pathlib.Path("/data/digits")},
}
GOOD = {"loss": 0.5, "n": 3, "pair": (1, "a"), "t": torch.arange(3), "nested": {"x": [1.5, None, True]}}


def main(out_dir):
    hk.init()
    rank = hk.rank()
    ckpt_dir = os.path.join(out_dir, "ckpt")
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    ckpt = hk.Checkpointer(ckpt_dir, model, torch.optim.SGD(model.parameters(), lr=0.1), keep=3)
    ckpt.save(step=1, epoch=0, extra={"seen": 1})
    errors = {
        name: error_of(lambda extra=extra: ckpt.save(step=2, epoch=0, extra=extra if rank == 0 else None), ConfigError)
        for name, extra in BAD.items()
    }
    listing = sorted(os.listdir(ckpt_dir))
    ckpt.save(step=3, epoch=1, extra=GOOD)
    resumed = hk.Checkpointer(ckpt_dir, torch.nn.Linear(3, 2)).restore()
    got = resumed.extra
    result = {
        "errors": errors,
        "listing_after_refusals": listing,
        "resumed_step": resumed.step,
        "resumed_types": {k: type(v).__name__ for k, v in got.items()},
        "resumed_equal": got.keys() == GOOD.keys()
        and all(torch.equal(got[k], v) if isinstance(v, torch.Tensor) else got[k] == v for k, v in GOOD.items()),
    }
    write_rank_result(out_dir, rank, result)


if __name__ == "__main__":
    main(sys.argv[1])
