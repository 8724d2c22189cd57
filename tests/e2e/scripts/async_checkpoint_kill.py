"""A torch job whose rank 0 is SIGKILLed while a background checkpoint write is in flight, and the
job that resumes after it (real ranks).

    async_checkpoint_kill.py kill DIR OUT     steps 1 and 2 saved (async_save, waited for); step 3
                                              saved async: after save() returned and the ranks went
                                              on training, rank 0's write thread SIGKILLs the
                                              process right before renaming its finished temporary
                                              folder into place
    async_checkpoint_kill.py resume DIR OUT   restores (async_save), records what came back, trains
                                              step 3 again and saves it (waited for)

Every step's state is the same on every rank and derived from the step alone (fixed data), so the
resumed job's step 3 must equal the killed job's. Rank 0 of ``kill`` writes OUT/kill.json (the
digest after each step, the listing at the kill); every rank of ``resume`` OUT/resume-rank<r>.json.
The pytest side is tests/e2e/test_checkpoint_crashes.py.
"""

import hashlib
import json
import os
import signal
import sys
import threading

import torch

import hvdkit.torch as hk

KILLED_STEP = 3


def make():
    torch.manual_seed(0)
    model = torch.nn.Linear(32, 16)
    return model, torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)


def train_step(model, opt, step):
    x = torch.linspace(-1, 1, 8 * 32).reshape(8, 32) * step
    opt.zero_grad()
    model(x).pow(2).mean().backward()
    opt.step()
    hk.communicator().barrier()  # the ranks go on together (rank 1 waits here when rank 0 dies)


def digest(model, opt):
    h = hashlib.sha256()
    momentum = [opt.state[p]["momentum_buffer"] for p in model.parameters() if p in opt.state]  # none before a step
    for t in [*model.state_dict().values(), *momentum]:
        h.update(t.detach().contiguous().view(-1).view(torch.uint8).numpy())
    return h.hexdigest()


def die_before_placing(directory, out, record, went_on):
    """Rank 0: the rename that would place step KILLED_STEP kills the process instead (after ``went_on``)."""
    real = os.rename
    name = f"-ckpt-{KILLED_STEP:012d}-"

    def rename(src, dst):
        if name in os.path.basename(src):
            went_on.wait(120)
            record["listing_at_kill"] = sorted(os.listdir(directory))
            with open(os.path.join(out, "kill.json"), "w") as f:
                json.dump(record, f)
            os.kill(os.getpid(), signal.SIGKILL)
        return real(src, dst)

    os.rename = rename


def kill(directory, out):
    rank = hk.init().rank
    model, opt = make()
    ckpt = hk.Checkpointer(directory, model, opt, keep=3, async_save=True)
    record, went_on = {"digests": {}}, threading.Event()
    if rank == 0:
        die_before_placing(directory, out, record, went_on)
    for step in range(1, KILLED_STEP + 1):
        train_step(model, opt, step)
        record["digests"][step] = digest(model, opt)
        record["returned_path"] = os.path.basename(ckpt.save(step, 0, extra={"step": step}))
        if step < KILLED_STEP:
            ckpt.wait()
    for step in range(KILLED_STEP + 1, KILLED_STEP + 100):  # training goes on while the write is in flight
        train_step(model, opt, step)
        record["trained_on_to"] = step
        went_on.set()
    ckpt.wait()  # not reached on rank 0
    print("NOT KILLED", flush=True)


def resume(directory, out):
    rank = hk.init().rank
    model, opt = make()
    before = digest(model, opt)
    ckpt = hk.Checkpointer(directory, model, opt, keep=3, async_save=True)
    resumed = ckpt.restore()
    record = {"before": before, "resumed": [resumed.step, resumed.extra], "restored": digest(model, opt)}
    train_step(model, opt, resumed.step + 1)
    record["step_after"] = digest(model, opt)
    ckpt.save(resumed.step + 1, 0, extra={"step": resumed.step + 1})
    ckpt.wait()
    record["listing"] = sorted(os.listdir(directory))
    with open(os.path.join(out, f"resume-rank{rank}.json"), "w") as f:
        json.dump(record, f)


if __name__ == "__main__":
    {"kill": kill, "resume": resume}[sys.argv[1]](sys.argv[2], sys.argv[3])
