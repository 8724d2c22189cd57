"""``horovod.run(fn, np=2)`` on hvdkit's engine, over Gloo and MPI (issue 27, item 4).

Each rank's return value comes back in rank order; a function that raises on one rank comes back as
an error naming that rank and its exception. Upstream named the first process to exit, which is the
rank that only saw Horovod shut down (engine fix 04). Its function store is signed (fix 03).
"""

import os

import pytest
from helpers import PYTHON, ROOT, last_json_line, run_bounded

pytestmark = pytest.mark.dist
SCRIPT = ROOT / "tests" / "engine" / "scripts" / "hvd_run_fn.py"


def _run(backend, mode):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HOROVOD_", "OMPI_"))}
    if os.geteuid() == 0:  # horovod.run's own mpirun command line has no --allow-run-as-root
        env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    proc = run_bounded([PYTHON, str(SCRIPT), backend, mode], 180, env=env, cwd=ROOT)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    return last_json_line(proc.stdout)


@pytest.mark.parametrize("backend", ["gloo", "mpi"])
def test_each_ranks_return_value_comes_back_in_rank_order(backend):
    assert _run(backend, "sum") == {"results": [21.0, 21.0]}  # (0 + 10) + (1 + 10) on both ranks


@pytest.mark.parametrize("backend", ["gloo", "mpi"])
def test_an_exception_on_one_rank_comes_back_naming_that_rank_and_the_exception(backend):
    out = _run(backend, "raise")
    assert out["error"] == "RuntimeError"
    assert out["message"].startswith("horovod.run: the function raised ValueError on rank 1: a bad value on rank one")
