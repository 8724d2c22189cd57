"""A pool case (tests/distributed/test_mpi_controller_wait.py): how much CPU rank 0's threads use while
Horovod's coordinator waits for a rank that does not answer.

Rank 1 stops itself (SIGSTOP: every thread of it, its Horovod background thread too); rank 0 sleeps,
and its background thread waits in the controller's collective for rank 1 the whole stretch, then rank 0
wakes rank 1 (SIGCONT). ``/proc/self/task/<tid>/schedstat`` gives each thread's time on a CPU (ns). A
thread that polls its request is on a CPU the whole stretch when the machine is quiet (and takes its
share of a core when it is not); a thread that sleeps between tests of it is on a CPU a few percent.
"""

import os
import signal
import time


def _schedstat():
    """``{tid: (ns on a CPU, times it was put on one)}`` for this process's threads."""
    stats = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/schedstat") as f:
                on_cpu, _waiting, runs = (int(x) for x in f.read().split())
        except (FileNotFoundError, ProcessLookupError):  # a thread that ended meanwhile
            continue
        stats[tid] = (on_cpu, runs)
    return stats


def _stopped(pid):
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0] == "T"


def busiest_thread_while_waiting(seconds=1.0):
    """On rank 0: the largest share of ``seconds`` one of its threads was on a CPU while rank 1 was stopped,
    and the thread count; on rank 1: None."""
    import horovod.torch as hvd
    import torch

    pids = hvd.allgather(torch.tensor([os.getpid()]), name="controller_wait.pids").tolist()
    if hvd.rank() == 1:
        os.kill(os.getpid(), signal.SIGSTOP)  # rank 0 sends SIGCONT when it has measured
        return None
    deadline = time.monotonic() + 30
    while not _stopped(pids[1]):
        if time.monotonic() > deadline:
            raise RuntimeError(f"rank 1 (pid {pids[1]}) did not stop within 30 s")
        time.sleep(0.01)
    try:
        time.sleep(0.1)  # the background thread is in its next round: waiting for rank 1
        before, start = _schedstat(), time.monotonic()
        time.sleep(seconds)
        after, wall = _schedstat(), time.monotonic() - start
    finally:
        os.kill(pids[1], signal.SIGCONT)
    used = {t: (after[t][0] - before[t][0], after[t][1] - before[t][1]) for t in after if t in before}
    ns, runs = max(used.values())
    return {"share": ns / 1e9 / wall, "us_per_run": ns / 1e3 / max(runs, 1), "runs": runs, "threads": len(used)}
