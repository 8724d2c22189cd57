"""The training script of ``python -m benchmarks elastic``: one small torch model, three ways to be elastic.

    python elastic_worker.py horovod OUT            under horovodrun --min-np/--max-np (hvd.elastic.run, TorchState)
    python elastic_worker.py hvdkit OUT             under hvdkit run --min-np/--max-np (Checkpointer, PreemptionGuard)
    python elastic_worker.py hvdkit-in-process OUT  under hvdkit run --recovery in-process (hk.Trainer, commit_every=1)

All commit (Horovod, hk.Trainer in memory) or checkpoint (hvdkit) after every step and append one
JSON line per step and rank to OUT/steps.jsonl: ``{"t", "host", "pid", "size", "step"}`` (``t``:
time.time() after the step). They stop, every rank after the same step, once OUT/stop exists.
"""

import json
import os
import sys
import time

import torch

MODE, OUT = sys.argv[1], sys.argv[2]
HOST = os.environ.get("HOROVOD_HOSTNAME", "?")
PACE = 0.05  # seconds of sleep per step: steps of a real job take time; keeps the 2 cores usable


def log(size, step):
    with open(os.path.join(OUT, "steps.jsonl"), "a") as f:
        f.write(json.dumps({"t": time.time(), "host": HOST, "pid": os.getpid(), "size": size, "step": step}) + "\n")


def model_and_data():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10))
    return model, torch.randn(32, 64), torch.randint(0, 10, (32,))


def stop_requested():
    return float(os.path.exists(os.path.join(OUT, "stop")))


def horovod_main():
    import horovod.torch as hvd

    hvd.init()
    model, x, y = model_and_data()
    opt = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.01), named_parameters=model.named_parameters()
    )
    state = hvd.elastic.TorchState(model=model, optimizer=opt, step=0)

    @hvd.elastic.run
    def train(state):
        while hvd.allreduce(torch.tensor([stop_requested()]), op=hvd.Max, name="stop").item() == 0:
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
            state.step += 1
            log(hvd.size(), state.step)
            time.sleep(PACE)
            state.commit()

    train(state)


def hvdkit_main():
    import hvdkit.torch as hk

    topo = hk.init()
    model, x, y = model_and_data()
    opt = hk.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01), model=model)
    ckpt = hk.Checkpointer(os.path.join(OUT, "ckpt"), model, opt, keep=2)
    resumed = ckpt.restore()
    if resumed is None:
        hk.broadcast_state(model, opt)
    step = 0 if resumed is None else resumed.step
    guard, comm = hk.PreemptionGuard(), hk.communicator()
    while comm.allreduce_sum([stop_requested()], name="bench.stop")[0] == 0:
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        step += 1
        log(topo.size, step)
        time.sleep(PACE)
        ckpt.save(step, 0)
        if guard.should_stop(step=step):  # the launcher grows the job: every rank stops after this step
            return


class PacedLog:
    """The Trainer's callback: log each step, sleep PACE, stop every rank after the step once OUT/stop exists."""

    def on_train_begin(self, trainer):
        self.trainer = trainer

    def on_train_batch_end(self, step, logs):
        log(self.trainer.comm.size, step)
        time.sleep(PACE)
        if stop_requested():
            self.trainer.stop_training = True


def trainer_main():
    import hvdkit.torch as hk

    model, x, y = model_and_data()
    # 32 samples per rank and step, as the other ways (which train on the same 32 every step)
    data = torch.utils.data.TensorDataset(x.repeat(200, 1), y.repeat(200))
    trainer = hk.Trainer(
        model,
        torch.optim.SGD(model.parameters(), lr=0.01),
        torch.nn.functional.cross_entropy,
        batch_size=32,
        compression="none",
        progress=False,
        commit_every=1,
        callbacks=[PacedLog()],
    )
    trainer.fit(data, epochs=10**6)


if __name__ == "__main__":
    {"horovod": horovod_main, "hvdkit": hvdkit_main, "hvdkit-in-process": trainer_main}[MODE]()
