"""Runs on every rank of a real 2-rank job: what torch checkpoints do with ``extra`` that would not
come back as it was at resume, and background saves (``async_save=True``). Writes OUT/rank<r>.json.

Rank 0's ``extra`` is the bad one, rank 1 passes None: rank 0's finding must reach rank 1 too.
``async_vs_sync``: the same state saved both ways, the async write held (write_gate) while the model
trains on, restores bitwise alike. ``step_after_save``: hvdkit's optimizers (plain, ZeRO-1, ZeRO-1 with
``hk.amp_step``) step straight after an async save whose copy rank 0's write thread holds: the step
waits for the copy, and the checkpoint's arrays are the sync save's bytes. ``write_error``: rank 0's file-size limit (RLIMIT_FSIZE, a
full disk as the kernel reports it) fails its background writes; every rank must raise it.
Usage: python checkpoint_extra_torch.py OUT
"""

import hashlib
import json
import os
import pathlib
import resource
import signal
import sys
import threading

import numpy as np
import torch
from recording import error_of, write_rank_result
from write_gate import hold_writes

import hvdkit.torch as hk
from hvdkit.core import CheckpointError, ConfigError

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
    result["async_vs_sync"] = async_vs_sync(out_dir, rank, hold_writes())
    result["write_error"] = write_error(out_dir, rank)
    result["step_after_save"] = {kind: step_after_save(out_dir, kind) for kind in ("plain", "sharded", "sharded_amp")}
    write_rank_result(out_dir, rank, result)


def digest(model, opt):
    h = hashlib.sha256()
    for t in [*model.state_dict().values(), *(opt.state[p]["momentum_buffer"] for p in model.parameters())]:
        h.update(t.detach().contiguous().view(-1).view(torch.uint8).numpy())
    return h.hexdigest()


def train(model, opt, steps):
    for i in range(steps):  # the same data on every rank: the ranks stay equal without communicating
        x = torch.linspace(-1, 1, 4 * 16).reshape(4, 16) * (i + 1)
        opt.zero_grad()
        model(x).pow(2).mean().backward()
        opt.step()


def fresh_digest(directory, rank):
    torch.manual_seed(100 + rank)  # other weights on each rank, no momentum
    model = torch.nn.Linear(16, 8)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    train(model, opt, 1)
    before = digest(model, opt)
    resumed = hk.Checkpointer(directory, model, opt).restore()
    return {"before": before, "after": digest(model, opt), "step": resumed.step, "extra": resumed.extra}


def arrays_sha(directory):
    with open(os.path.join(directory, "ckpt-000000000004", "manifest.json")) as f:
        return json.load(f)["files"]["arrays.npz"]["sha256"]


def async_vs_sync(out_dir, rank, gate):
    torch.manual_seed(1)
    model = torch.nn.Linear(16, 8)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    train(model, opt, 2)
    sync_dir, async_dir = os.path.join(out_dir, "sync"), os.path.join(out_dir, "async")
    sync = hk.Checkpointer(sync_dir, model, opt, keep=2)
    background = hk.Checkpointer(async_dir, model, opt, keep=2, async_save=True)
    saved = digest(model, opt)
    sync.save(4, 1, extra={"k": 1})
    gate.clear()  # rank 0's write waits until the model has moved on
    path = background.save(4, 1, extra={"k": 1})
    in_place_when_save_returned = os.path.isdir(path)
    train(model, opt, 3)
    moved = digest(model, opt) != saved
    gate.set()
    written = background.wait()
    hk.communicator().barrier()
    return {
        "path": os.path.relpath(path, out_dir),
        "written": os.path.relpath(written, out_dir),
        "in_place_when_save_returned": in_place_when_save_returned,
        "moved_on": moved,
        "saved": saved,
        "sync": fresh_digest(sync_dir, rank),
        "async": fresh_digest(async_dir, rank),
        "same_arrays_file": arrays_sha(sync_dir) == arrays_sha(async_dir),
    }


class HeldCopy(hk.Checkpointer):
    """Rank 0's write thread holds its copy of the state until ``gate`` is set; ``events`` in order."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.gate, self.events = threading.Event(), []

    def _copy_into(self, items, old, staging, ready=None):
        if not threading.current_thread().name.startswith("hvdkit-ckpt-write"):
            return super()._copy_into(items, old, staging, ready)
        if not self.gate.wait(120):
            raise TimeoutError("the test never released the copy")
        out = super()._copy_into(items, old, staging, ready)
        self.events.append("copied")
        return out


def step_after_save(out_dir, kind):
    """Save (sync, then async with rank 0's copy held), step at once; the events and whether the files match."""
    torch.manual_seed(3)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Linear(32, 8))
    base = torch.optim.Adam(model.parameters(), lr=0.05) if kind != "plain" else None
    base = base or torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    opt = hk.DistributedOptimizer(base, model=model, shard_optimizer_state=kind != "plain")
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0) if kind == "sharded_amp" else None

    def step(i):
        x = torch.linspace(-1, 1, 4 * 16).reshape(4, 16) * (i + 1 + hk.rank())
        opt.zero_grad()
        loss = model(x).pow(2).mean()
        if scaler is None:
            loss.backward()
            opt.step()
        else:
            scaler.scale(loss).backward()
            hk.amp_step(opt, scaler)

    step(0)
    sync_dir, async_dir = os.path.join(out_dir, f"{kind}-sync"), os.path.join(out_dir, f"{kind}-async")
    sync = hk.Checkpointer(sync_dir, model, opt, keep=1)
    held = HeldCopy(async_dir, model, opt, keep=1, async_save=True)
    before = [p.detach().clone() for p in model.parameters()]
    sync.save(4, 1)
    held.save(4, 1)
    copying = held.store.copying
    release = threading.Timer(0.3, lambda: (held.events.append("copy released"), held.gate.set()))
    if hk.rank() == 0:  # elsewhere nothing copies in the background
        release.start()
    else:
        held.gate.set()
    step(1)  # on rank 0 it must wait for the copy: the parameters and the moments change in place
    held.events.append("step done")
    if hk.rank() == 0:
        release.join()
    changed = any(not torch.equal(a, p) for a, p in zip(before, model.parameters(), strict=True))
    held.wait()
    hk.communicator().barrier()
    same = arrays_sha(sync_dir) == arrays_sha(async_dir) if hk.rank() == 0 else None
    return {"copying_when_save_returned": copying, "events": held.events, "changed": changed, "same_arrays": same}


def limit_file_size(rank, limit):
    """Rank 0: writes past ``limit`` bytes fail with EFBIG ("File too large"); None: no limit again."""
    if rank != 0:
        return
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # the error, not the signal that would end the process
    _, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (hard if limit is None else limit, hard))


def write_error(out_dir, rank):
    directory = os.path.join(out_dir, "full")
    torch.manual_seed(1)
    model = torch.nn.Linear(16, 8)
    ckpt = hk.Checkpointer(directory, model, torch.optim.SGD(model.parameters(), lr=0.1), async_save=True)
    ckpt.save(1, 0)
    ckpt.wait()
    limit_file_size(rank, 4096)  # the arrays file of every rank's RNG states alone is larger
    ckpt.save(2, 0)  # returns: rank 0's thread meets the error
    at_wait = error_of(ckpt.wait, CheckpointError)
    ckpt.save(3, 0)
    at_next_save = error_of(lambda: ckpt.save(4, 0), CheckpointError)
    limit_file_size(rank, None)
    ckpt.save(5, 0)
    ckpt.wait()
    return {"at_wait": at_wait, "at_next_save": at_next_save, "listing": sorted(os.listdir(directory))}


if __name__ == "__main__":
    main(sys.argv[1])
