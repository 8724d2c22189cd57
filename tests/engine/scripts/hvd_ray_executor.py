"""``horovod.ray``'s executors as users call them, on a local Ray; prints a JSON line per mode, then one for the
whole run.

    python hvd_ray_executor.py MODE[,MODE...] PIDS_FILE     # modes: torch, torch_colocated, keras, raise,
                                                            # elastic, elastic_legacy

The modes run one after the other on one local Ray (a local Ray takes 10-25 s to start on 2 busy cores), each
with an executor of its own that it starts and shuts down.

``torch``: 2 workers (``torch_colocated``: placed by ``num_hosts=1, num_workers_per_host=2``),
``horovod.torch``: rank 0's weights broadcast, one SGD step on rank-dependent inputs with Horovod's
DistributedOptimizer, an allreduce of rank + 1. ``keras``: the same with
``horovod.tensorflow.keras`` (DistributedOptimizer, broadcast and metric-average callbacks) in
``model.fit``. ``raise``: rank 1 raises ValueError after a first allreduce while rank 0 goes on to a
second allreduce that can no longer complete. ``elastic`` (``RayExecutor(min_workers=2, ...)``) and
``elastic_legacy`` (``ElasticRayExecutor``): a TorchState loop of 3 committed steps in which rank 1
raises HorovodInternalError once after its second step (the job restores the last commit and goes
on). Every mode reports the DeprecationWarnings the
executor's calls raised here, the workers' pids and which of them outlived ``executor.shutdown()``;
the last line, which processes of the run outlived ``ray.shutdown()``. Every pid this driver saw under it is
appended to PIDS_FILE as soon as it is seen, so that the test can end what a killed run leaves.
"""

import json
import os
import sys
import time
import warnings

import ray
from horovod.ray import ElasticRayExecutor, RayExecutor

TORCH_W0 = [[1.0, -2.0]]
KERAS_W0 = [[1.0], [-0.5]]


def torch_train():
    import horovod.torch as hvd
    import torch

    hvd.init()
    torch.manual_seed(hvd.rank())
    model = torch.nn.Linear(2, 1, bias=False)
    if hvd.rank() == 0:
        with torch.no_grad():
            model.weight.copy_(torch.tensor(TORCH_W0))
    opt = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.1), named_parameters=model.named_parameters()
    )
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    opt.zero_grad()
    model(torch.full((1, 2), float(hvd.rank() + 1))).sum().backward()  # gradient (rank + 1) * [1, 1]
    opt.step()
    return _torch_result(hvd, torch, model)


def _torch_result(hvd, torch, model, **extra):
    """What a torch worker returns: its rank, the world size, its pid, the sum of rank + 1 over the ranks
    (an allreduce after training), its weights, and ``extra``."""
    total = hvd.allreduce(torch.tensor(float(hvd.rank() + 1)), op=hvd.Sum, name="rank_sum")
    found = {"rank": hvd.rank(), "size": hvd.size(), "pid": os.getpid(), "sum": float(total)}
    return {**found, "weights": model.weight.detach().tolist(), **extra}


def keras_train():
    import horovod.tensorflow.keras as hvd
    import keras
    import numpy as np
    import tensorflow as tf

    hvd.init()
    keras.utils.set_random_seed(hvd.rank())
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1, use_bias=False)])
    if hvd.rank() == 0:
        model.set_weights([np.array(KERAS_W0, np.float32)])
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.01)), loss="mse")
    x = np.full((4, 2), float(hvd.rank() + 1), np.float32)
    history = model.fit(
        x,
        np.zeros((4, 1), np.float32),
        batch_size=4,
        epochs=2,
        verbose=0,
        shuffle=False,
        callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0), hvd.callbacks.MetricAverageCallback()],
    )
    total = hvd.allreduce(tf.constant(float(hvd.rank() + 1)), op=hvd.Sum, name="rank_sum")
    return {
        "rank": hvd.rank(),
        "size": hvd.size(),
        "pid": os.getpid(),
        "sum": float(total),
        "weights": model.get_weights()[0].tolist(),
        "loss": [float(v) for v in history.history["loss"]],
    }


def raise_on_rank_one():
    import horovod.torch as hvd
    import torch

    hvd.init()
    hvd.allreduce(torch.tensor(1.0), name="first")
    if hvd.rank() == 1:
        raise ValueError("a bad value on rank one")
    hvd.allreduce(torch.tensor(1.0), name="second")  # rank 0 waits here for rank 1
    return {"rank": hvd.rank(), "pid": os.getpid()}


def elastic_train(marker):
    import horovod.torch as hvd
    import torch
    from horovod.common.exceptions import HorovodInternalError

    hvd.init()
    model = torch.nn.Linear(2, 1, bias=False)
    with torch.no_grad():
        model.weight.copy_(torch.tensor(TORCH_W0))
    opt = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.1), named_parameters=model.named_parameters()
    )
    state = hvd.elastic.TorchState(model=model, optimizer=opt, step=0)

    @hvd.elastic.run
    def loop(state):
        while state.step < 3:
            opt.zero_grad()
            model(torch.full((1, 2), float(hvd.rank() + 1))).sum().backward()
            opt.step()
            if state.step == 1 and hvd.rank() == 1 and not os.path.exists(marker):
                open(marker, "w").close()  # once: rank 1 fails after its second step, before the commit
                raise HorovodInternalError("injected on rank 1")
            state.step += 1
            state.commit()
        return _torch_result(hvd, torch, model, steps=state.step)

    return loop(state)


class _CreatesAFile:
    """A pickle that creates ``path`` when it is unpickled."""

    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


def forged_registration(env, marker):
    """HTTP status of an unsigned worker registration (a pickle) PUT to the job's rendezvous."""
    import pickle
    import urllib.error
    import urllib.request

    url = "http://{}:{}/worker_addresses/localhost:0".format(
        env["HOROVOD_GLOO_RENDEZVOUS_ADDR"], env["HOROVOD_GLOO_RENDEZVOUS_PORT"]
    )
    request = urllib.request.Request(url, data=pickle.dumps(_CreatesAFile(marker)), method="PUT")
    try:
        with urllib.request.urlopen(request, timeout=10) as reply:
            return reply.status
    except urllib.error.HTTPError as e:
        return e.code


def descendants(root):
    """Pids of every process under ``root`` (from /proc's parent links)."""
    parents = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    parents[int(entry)] = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
    found, frontier = set(), {root}
    while frontier:
        frontier = {pid for pid, ppid in parents.items() if ppid in frontier} - found
        found |= frontier
    return found


def alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def outliving(pids, seconds=20.0):
    """The pids still alive after waiting up to ``seconds`` for all of them to end."""
    deadline = time.monotonic() + seconds
    while True:
        left = sorted(p for p in pids if alive(p))
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.2)


def run_mode(mode, pids_file, note):
    """One mode's executor, started, run and shut down on the running local Ray: what it reports."""
    fn = {"torch": torch_train, "torch_colocated": torch_train, "keras": keras_train, "raise": raise_on_rank_one}.get(
        mode, elastic_train
    )
    marker = f"{pids_file}.{mode}.fault"
    out = {"mode": mode}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", DeprecationWarning)
        if mode == "elastic":
            executor = RayExecutor(
                RayExecutor.create_settings(timeout_s=60),
                min_workers=2,
                max_workers=2,
                cpus_per_worker=1,
                use_gpu=False,
                elastic_timeout=60,
            )
        elif mode == "elastic_legacy":
            settings = ElasticRayExecutor.create_settings(
                min_num_proc=2, max_num_proc=2, elastic_timeout=60, timeout_s=60
            )
            executor = ElasticRayExecutor(settings, cpus_per_slot=1, use_gpu=False)
        elif mode == "torch_colocated":  # ColocatedStrategy: one placement-group bundle per host
            executor = RayExecutor(
                RayExecutor.create_settings(timeout_s=60),
                num_hosts=1,
                num_workers_per_host=2,
                cpus_per_worker=1,
                use_gpu=False,
            )
        else:
            executor = RayExecutor(
                RayExecutor.create_settings(timeout_s=60), num_workers=2, cpus_per_worker=1, use_gpu=False
            )
        started = time.monotonic()
        executor.start()
        note(descendants(os.getpid()))
        if mode.startswith("elastic"):
            forged = f"{pids_file}.{mode}.forged"
            out["forged_put_status"] = forged_registration(getattr(executor, "adapter", executor).run_env_vars, forged)
            out["forged_pickle_ran"] = os.path.exists(forged)
        workers = [] if mode.startswith("elastic") else sorted(executor.execute(lambda _: os.getpid()))
        out["worker_pids"] = workers
        try:
            if mode == "elastic":
                out["results"] = executor.run(fn, args=[marker])
            elif mode == "elastic_legacy":
                out["results"] = executor.run(lambda: fn(marker))
            else:
                out["results"] = executor.run(fn)
            out["fault_injected"] = os.path.exists(marker)
        except Exception as e:  # noqa: BLE001 - reported to the test
            out["error"] = type(e).__name__
            out["message"] = str(e)
        out["run_s"] = round(time.monotonic() - started, 1)
        note(descendants(os.getpid()))
        if mode != "elastic_legacy":  # it has no shutdown(); its driver ended with run()
            executor.shutdown()
        out["workers_after_executor_shutdown"] = outliving(workers)
    out["deprecations"] = [
        f"{w.filename}:{w.lineno}: {w.message}" for w in caught if issubclass(w.category, DeprecationWarning)
    ]
    return out


def main(modes, pids_file):
    def note(pids):
        with open(pids_file, "a") as f:
            f.write("".join(f"{p}\n" for p in sorted(pids)))

    ray.init(address="local", num_cpus=2, include_dashboard=False)
    note(descendants(os.getpid()))
    for mode in modes.split(","):
        print(json.dumps(run_mode(mode, pids_file, note)), flush=True)
    job = descendants(os.getpid())  # Ray's own processes (raylet, GCS, idle workers) and what a mode left
    note(job)
    ray.shutdown()
    print(json.dumps({"ray_processes": len(job), "after_ray_shutdown": outliving(job)}), flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:])
