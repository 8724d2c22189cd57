"""A pool case (tests/distributed/test_torch_synchronize_wait.py): what rank 1's main thread does while it waits
in ``synchronize()`` for rank 0, which joins the allreduce ``seconds`` later.

``/proc/self/task/<tid>/schedstat`` gives the thread's time on a CPU (ns) and how many times it was put on one.
A thread that polls its handle is on a CPU the whole wait when the machine is quiet, and when it is not it is put
back on a CPU hundreds to thousands of times a second (each yield hands the core over and takes it back); a thread
that polls a few milliseconds and then sleeps until the operation is done is on a CPU for those milliseconds.
"""

import threading
import time


def _main_thread_schedstat():
    with open(f"/proc/self/task/{threading.get_native_id()}/schedstat") as f:
        on_cpu, _waiting, runs = (int(x) for x in f.read().split())
    return on_cpu, runs


def main_thread_while_waiting(seconds=1.0):
    """On rank 1: the share of the wait its main thread was on a CPU, and how often a second it was put on one;
    on rank 0 (which sleeps ``seconds`` first): None. The allreduce's sum is checked on both."""
    import horovod.torch as hvd
    import torch

    hvd.allreduce(torch.ones(4), name="synchronize_wait.warm")  # both ranks are in the job and warm
    if hvd.rank() == 0:
        time.sleep(seconds)
    before, start = _main_thread_schedstat(), time.monotonic()
    total = hvd.allreduce(torch.full((1024,), float(hvd.rank() + 1)), op=hvd.Sum, name="synchronize_wait.late")
    after, wall = _main_thread_schedstat(), time.monotonic() - start
    if not torch.equal(total, torch.full((1024,), 3.0)):
        raise AssertionError(f"the allreduce after the wait summed to {total[:4].tolist()}..., not 3")
    if hvd.rank() == 0:
        return None
    return {
        "wall": wall,
        "share": (after[0] - before[0]) / 1e9 / wall,
        "runs_per_second": (after[1] - before[1]) / wall,
    }
