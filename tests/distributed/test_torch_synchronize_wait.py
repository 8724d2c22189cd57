"""Engine fix 80 (hvdkit/engine/recipe/horovod-fixes/80-torch-synchronize-waits-without-spinning.patch): a torch
rank that waits in ``synchronize()`` for a slower rank sleeps instead of polling.

Horovod's ``WaitAndClear`` polled the handle with ``std::this_thread::yield()`` and took the GIL back at every
turn, so a rank waiting for another (a checkpoint on rank 0, an uneven step, a late start) kept a core busy:
5.1-5.6 s of CPU in a 5 s wait under mpirun, 6.9 s under Gloo, on 2 cores. A case of the pool's torch/mpirun job
makes rank 1 wait a second for rank 0 in an allreduce and reads its main thread's scheduler counters over the
middle of the wait (tests/distributed/workers/synchronize_wait.py).
"""

import pool
import pytest

pytestmark = pytest.mark.dist


def test_a_rank_waiting_in_synchronize_sleeps_instead_of_polling():
    got = pool.run_case("mpirun", "torch", "synchronize_wait:main_thread_while_waiting", {"seconds": 1.0})[1]
    assert got["waited"] >= 0.9 and got["window"] >= 0.45, got  # it did wait for rank 0, and was watched meanwhile
    # Polling: on a CPU the whole window when quiet (share ~1); under load put back on one again and again (each
    # yield). Sleeping: not on a CPU in the window at all (the fix polls 5 ms at the start, then sleeps).
    assert got["share"] < 0.02, f"rank 1's main thread was on a CPU {got['share']:.0%} of its wait: it polls"
    assert got["runs"] <= 2, f"rank 1's main thread was put on a CPU {got['runs']} times in half a second of its wait"
