"""A Horovod elastic PyTorch job that loses a worker process while its host stays listed.

    horovodrun -np 2 --min-np 1 --max-np 2 --host-discovery-script D --gloo python hvd_torch_lost_worker.py OUT MODE

Every step trains a small model on data fixed by (step, rank), commits, and appends one line
``time step size rank host pid`` to OUT/steps.log. MODE:
  kill   at 2 ranks, after step ``EVENT_AT``, rank 0 kills itself with SIGKILL once (its host,
         and so its slot, stays listed). The job runs until it has trained at 2 ranks again for
         ``AFTER_REJOIN`` steps (a new worker took the slot), and at least ``STEPS`` steps.
  fail   at 2 ranks, after step ``EVENT_AT``, rank 1 writes its host to OUT/bad_host and exits 1;
         every later worker on that host appends to OUT/bad_exits and exits 1 at its first step. The
         job runs at least ``STEPS`` steps, and ``AFTER_LEFT_OUT`` steps alone after that second
         failure (not after its start: the driver may start a joining worker while the others train).
Rank 0 is the worker on slot 0 of ``localhost:2``: killing it makes the survivor (slot 1) move down
to local rank 0 and become rank 0. Each process appends ``host pid`` to OUT/starts.log when it
starts, each reset appends ``time size rank host pid`` to OUT/resets.log; at the end every rank
writes its parameters to OUT/final.<rank>.json. ``MAX_STEPS`` bounds a run whose event never comes.
OUT/order.log gets ``imported pid`` from each process when its imports are done (just before
hvd.init) and ``interrupted size pid`` when a commit raises HostsUpdatedInterrupt, in the order written.
"""

import json
import os
import signal
import sys
import time

OUT, MODE = sys.argv[1], sys.argv[2]
HOST = os.environ.get("HOROVOD_HOSTNAME", "?")
with open(os.path.join(OUT, "starts.log"), "a") as f:  # before the slow imports
    f.write(f"{HOST} {os.getpid()}\n")

import horovod.torch as hvd  # noqa: E402
import torch  # noqa: E402
from horovod.common.exceptions import HostsUpdatedInterrupt  # noqa: E402

STEPS, EVENT_AT, AFTER_REJOIN, AFTER_LEFT_OUT, MAX_STEPS = 30, 5, 3, 20, 1200
PACE = 0.05  # seconds a step


def path(name):
    return os.path.join(OUT, name)


def append(name, line):
    with open(path(name), "a") as f:
        f.write(line + "\n")


def bad_host():
    try:
        with open(path("bad_host")) as f:
            return f.read()
    except FileNotFoundError:
        return None


def bad_exits():
    return os.path.exists(path("bad_exits"))


append("order.log", f"imported {os.getpid()}")
hvd.init()
torch.manual_seed(0)
model = torch.nn.Linear(4, 1)
optimizer = hvd.DistributedOptimizer(
    torch.optim.SGD(model.parameters(), lr=0.01), named_parameters=model.named_parameters()
)
state = hvd.elastic.TorchState(model=model, optimizer=optimizer, step=0, killed_at=-1, rejoined_at=-1, alone=0)
state.register_reset_callbacks(
    [lambda: append("resets.log", f"{time.time():.3f} {hvd.size()} {hvd.rank()} {HOST} {os.getpid()}")]
)


def done(state):
    if state.step >= MAX_STEPS:
        return True
    if MODE == "kill":
        return state.step >= STEPS and state.rejoined_at >= 0 and state.step >= state.rejoined_at + AFTER_REJOIN
    # fail: until the bad host's second worker has failed, and a while after (no third one comes)
    return state.step >= STEPS and state.alone >= AFTER_LEFT_OUT


def event(state):
    size, rank = hvd.size(), hvd.rank()
    if MODE == "kill" and size == 2 and state.step >= EVENT_AT and state.killed_at < 0:
        if rank == 0 and not os.path.exists(path("killed")):
            open(path("killed"), "w").close()
            os.kill(os.getpid(), signal.SIGKILL)
    if MODE == "fail" and size == 2 and state.step >= EVENT_AT and bad_host() is None and rank == 1:
        with open(path("bad_host.tmp"), "w") as f:
            f.write(HOST)
        os.replace(path("bad_host.tmp"), path("bad_host"))
        os._exit(1)


@hvd.elastic.run
def train(state):
    while not done(state):
        if MODE == "fail" and bad_host() == HOST:
            append("bad_exits", f"{HOST} {os.getpid()}")
            os._exit(1)  # this host's workers fail on every start
        step, size, rank = state.step, hvd.size(), hvd.rank()
        gen = torch.Generator().manual_seed(1000 * step + rank)
        x = torch.randn(8, 4, generator=gen)
        optimizer.zero_grad()
        model(x).pow(2).mean().backward()
        optimizer.step()
        if size == 1 and os.path.exists(path("killed")) and state.killed_at < 0:
            state.killed_at = step  # the first step the survivor trains alone
        if state.killed_at >= 0 and size == 2 and state.rejoined_at < 0:
            state.rejoined_at = step
        if MODE == "fail" and size == 1 and bad_exits():
            state.alone += 1  # steps alone after the bad host's second worker failed
        state.step += 1
        append("steps.log", f"{time.time():.3f} {step} {size} {rank} {HOST} {os.getpid()}")
        event(state)
        time.sleep(PACE)
        try:
            state.commit()
        except HostsUpdatedInterrupt:
            append("order.log", f"interrupted {size} {os.getpid()}")
            raise


train(state)
with open(path(f"final.{hvd.rank()}.json"), "w") as f:
    json.dump([float(v) for p in model.parameters() for v in p.detach().flatten()], f)
print("DONE", hvd.rank(), hvd.size(), flush=True)
