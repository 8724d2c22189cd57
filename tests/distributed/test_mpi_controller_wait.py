"""Engine fix 20 (hvdkit/engine/recipe/horovod-fixes/20-common-mpi-controller-waits-without-spinning.patch):
under mpirun, Horovod's coordinator waits for a slow rank without holding a core.

Before the fix, rank 0's background thread waited in Open MPI's blocking collectives, which poll without
pause: in an idle 2-rank job one rank used a whole core (9.9 s of CPU in 10 s; Gloo 0.7 s). A case of the
pool's torch/mpirun job stops rank 1 for a second and looks at rank 0's busiest thread meanwhile
(tests/distributed/workers/controller_wait.py): a polling thread stays on the CPU until the scheduler takes
it off (3.6-3.9 ms a time with 6 busy processes beside it, a whole second when quiet); the fixed wait gives the
CPU back after each test of its request (15-18 us a time, loaded or quiet).
"""

import pool
import pytest

pytestmark = pytest.mark.dist


def test_the_mpi_coordinator_waits_for_a_stopped_rank_without_polling():
    got = pool.run_case("mpirun", "torch", "controller_wait:busiest_thread_while_waiting", {"seconds": 1.0})[0]
    assert got["threads"] >= 2, got  # the main thread and Horovod's background thread at least
    assert got["us_per_run"] < 500, (
        f"rank 0's busiest thread stayed on a CPU {got['us_per_run']:.0f} us a time ({got['share']:.0%} of the"
        f" second) while it waited for rank 1: it polls"
    )
