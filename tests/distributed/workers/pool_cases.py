"""Cases for the pool's own tests (tests/distributed/test_pool.py): known answers, and the ways a case fails."""

import logging
import os
import signal
import time

import numpy as np
import torch

import hvdkit.core.log as hvdkit_log
import hvdkit.torch as hk


def allreduce_of_ranks(scale):
    """Every rank's place in the job and the sum over ranks of ``scale * (rank + 1)`` (a real collective)."""
    topo = hk.init()
    (total,) = hk.communicator().allreduce_sum([float(scale * (topo.rank + 1))], name="pool.case.sum")
    return {"rank": topo.rank, "size": topo.size, "sum": total, "pid": os.getpid()}


def leave_state_behind(marker):
    """Change what a careless case could leave for the next one; return what it looked like before."""
    seen = observe_state()
    os.environ["HVDKIT_POOL_LEAK"] = marker
    os.environ["HVDKIT_LOG_LEVEL"] = "DEBUG"
    logging.getLogger("hvdkit").addHandler(logging.NullHandler())
    hvdkit_log._state["leak"] = marker
    hvdkit_log.LEAK = marker
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)
    torch.manual_seed(12345)
    torch.set_num_threads(1 if torch.get_num_threads() != 1 else 2)
    np.random.seed(12345)
    os.chdir("/")
    return seen


def observe_state():
    """What a case finds when it starts: env, hvdkit's log globals, handlers, signals, RNG draws, threads."""
    return {
        "env": {k: os.environ.get(k) for k in ("HVDKIT_POOL_LEAK", "HVDKIT_LOG_LEVEL", "HVDKIT_POOL_CASE_VAR")},
        "log_state_keys": sorted(hvdkit_log._state),
        "log_leak": getattr(hvdkit_log, "LEAK", None),
        "handlers": len(logging.getLogger("hvdkit").handlers),
        "sigusr1_default": signal.getsignal(signal.SIGUSR1) == signal.SIG_DFL,
        "torch_draw": torch.rand(2).tolist(),
        "numpy_draw": np.random.rand(2).tolist(),
        "threads": torch.get_num_threads(),
        "cwd": os.getcwd(),
    }


def fail_on(rank, message):
    """Raise on ``rank`` only (the other ranks return normally)."""
    if hk.init().rank == rank:
        raise ValueError(message)
    return "fine"


def hang_on(rank):
    """Never return on ``rank`` (a case that hangs)."""
    if hk.init().rank == rank:
        while True:
            time.sleep(0.1)
    return "fine"


def exit_on(rank, code):
    """End the process of ``rank`` at once (a case that kills its job)."""
    if hk.init().rank == rank:
        os._exit(code)
    time.sleep(30)  # the launcher ends this rank once the other has gone
    return "fine"
