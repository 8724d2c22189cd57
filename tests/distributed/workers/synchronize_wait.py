"""A pool case (tests/distributed/test_torch_synchronize_wait.py): what rank 1's main thread does while it waits
in ``synchronize()`` for rank 0, which joins the allreduce ``seconds`` later.

``/proc/self/task/<tid>/schedstat`` gives a thread's time on a CPU (ns) and how many times it was put on one. A
watcher thread reads the main thread's counters over the middle of the wait (from 30 % to 80 % of it: past the
engine's short poll at its start, HOROVOD_TORCH_WAIT_POLL_US). A thread that polls its handle is on a CPU there
the whole time when the machine is quiet, and is put back on one again and again when it is not (each yield
hands the core over and takes it back); a thread that sleeps until the operation is done is not on a CPU at all.
"""

import threading
import time


def _schedstat(tid):
    with open(f"/proc/self/task/{tid}/schedstat") as f:
        on_cpu, _waiting, runs = (int(x) for x in f.read().split())
    return on_cpu, runs


def main_thread_while_waiting(seconds=1.0):
    """On rank 1: the share of the middle of its wait its main thread was on a CPU, and how many times it was put
    on one there; on rank 0 (which sleeps ``seconds`` first): None. The allreduce's sum is checked on both."""
    import horovod.torch as hvd
    import torch

    hvd.allreduce(torch.ones(4), name="synchronize_wait.warm")  # both ranks are in the job and warm
    if hvd.rank() == 0:
        time.sleep(seconds)
    main, seen = threading.get_native_id(), {}

    def watch():
        time.sleep(0.3 * seconds)
        before, t0 = _schedstat(main), time.monotonic()
        time.sleep(0.5 * seconds)
        after, wall = _schedstat(main), time.monotonic() - t0
        seen.update(share=(after[0] - before[0]) / 1e9 / wall, runs=after[1] - before[1], window=wall)

    watcher = threading.Thread(target=watch, daemon=True)
    start = time.monotonic()
    watcher.start()
    total = hvd.allreduce(torch.full((1024,), float(hvd.rank() + 1)), op=hvd.Sum, name="synchronize_wait.late")
    waited = time.monotonic() - start
    watcher.join()
    if not torch.equal(total, torch.full((1024,), 3.0)):
        raise AssertionError(f"the allreduce after the wait summed to {total[:4].tolist()}..., not 3")
    return None if hvd.rank() == 0 else {"waited": waited, **seen}
