"""A Horovod elastic PyTorch script written against Horovod's public API only, as users write them.

    horovodrun -np 2 --min-np 1 --max-np 2 --host-discovery-script DISCOVER --gloo python hvd_torch_elastic.py OUT [events]

``OUT/hosts`` is what the discovery script prints (elastic_hosts.py); with ``events`` the script changes it itself at
fixed points so that the job goes through every elastic event in one run, in this order:
  1. at 2 ranks, after step ``REMOVE_AT``, rank 0 removes the other host (of ``localhost`` and ``127.0.0.1``,
     the one it does not run on: Horovod orders hosts it discovers together by a set's order, which
     changes with each process's hash seed), and that host's worker ends;
  2. at 1 rank, after 2 more steps, it adds that host back (a new worker joins);
  3. at 2 ranks again, the worker on that host kills itself (SIGKILL) once: the job goes on at 1 rank.
Every step commits. Each sample's value is added, summed over the ranks, to ``state.total``: when
every sample is processed exactly once per epoch (the ``ElasticSampler`` resumes mid-epoch from the
last commit, the lost step is redone), the final total is ``EPOCHS * sum(range(SAMPLES))``.
Rank 0 writes OUT/result.json; every reset callback appends a line to OUT/resets.
"""

import json
import os
import signal
import sys
import time

import horovod.torch as hvd
import torch
from elastic_hosts import path, set_hosts, wait_for_the_join

SAMPLES, EPOCHS, BATCH = 24, 3, 2
REMOVE_AT = 3  # global commits at 2 ranks before the host is removed
EVENTS = sys.argv[2:] == ["events"]  # otherwise the hosts stay as they are
HOST = os.environ.get("HOROVOD_HOSTNAME", "?")


hvd.init()
torch.manual_seed(0)
data = torch.arange(SAMPLES, dtype=torch.float32)
model = torch.nn.Linear(1, 1)
optimizer = hvd.DistributedOptimizer(
    torch.optim.SGD(model.parameters(), lr=0.01), named_parameters=model.named_parameters()
)
sampler = hvd.elastic.ElasticSampler(data, shuffle=True, seed=1)
state = hvd.elastic.TorchState(model=model, optimizer=optimizer, sampler=sampler, epoch=0, steps=0, total=0.0)


def on_reset():
    with open(path("resets"), "a") as f:
        f.write(f"{hvd.size()}\n")


state.register_reset_callbacks([on_reset])


@hvd.elastic.run
def train(state):
    while state.epoch < EPOCHS:
        indices = list(iter(state.sampler))  # this rank's remaining samples of the epoch
        for start in range(0, len(indices), BATCH):
            batch = indices[start : start + BATCH]
            x = data[batch].unsqueeze(1)
            optimizer.zero_grad()
            model(x).pow(2).mean().backward()
            optimizer.step()
            local = torch.tensor([float(data[batch].sum())], dtype=torch.float64)
            state.total += float(hvd.allreduce(local, op=hvd.Sum, name="total"))
            state.sampler.record_batch(start // BATCH, BATCH)
            state.steps += 1
            if EVENTS:
                events(state)
            state.commit()
            if EVENTS:
                wait_for_the_join(state, hvd.size())
        state.epoch += 1
        state.sampler.set_epoch(state.epoch)  # a new epoch: nothing processed yet
        state.commit()


def other_host():
    return "127.0.0.1" if HOST == "localhost" else "localhost"


def removed_host():
    with open(path("removed_host")) as f:
        return f.read()


def events(state):
    size = hvd.size()
    if hvd.rank() == 0 and size == 2 and state.steps >= REMOVE_AT and not os.path.exists(path("removed")):
        with open(path("removed_host"), "w") as f:
            f.write(other_host())
        set_hosts(f"{HOST}:1\n", "removed")
        state.removed_at = state.steps
    if hvd.rank() == 0 and size == 1 and os.path.exists(path("removed")) and not os.path.exists(path("added")):
        if not hasattr(state, "added_after"):
            state.added_after = state.steps + 2
        if state.steps >= state.added_after:
            set_hosts("localhost:1\n127.0.0.1:1\n", "added")
    if size == 2 and os.path.exists(path("added")) and HOST == removed_host() and not os.path.exists(path("killed")):
        open(path("killed"), "w").close()
        os.kill(os.getpid(), signal.SIGKILL)
    pending = (os.path.exists(path("removed")) and size == 2 and not os.path.exists(path("added"))) or (
        os.path.exists(path("added")) and size == 1 and not os.path.exists(path("killed"))
    )
    if pending:
        time.sleep(0.5)  # give host discovery time to see the change before the epochs run out


train(state)
if hvd.rank() == 0:
    with open(path("result.json"), "w") as f:
        json.dump({"total": state.total, "epochs": state.epoch, "steps": state.steps, "size": hvd.size()}, f)
print("DONE", hvd.rank(), hvd.size(), flush=True)
