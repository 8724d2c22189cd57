"""Fixtures shared by every test."""

import os
import sys

import pytest

# MLflow 3 starts a usage-telemetry thread on import that sets, and later may unset,
# _MLFLOW_TELEMETRY_SESSION_ID at a moment of its choosing (a spurious "leak" below), and tries to
# reach the internet. Off for the whole test session and the ranks it starts.
os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
# Open MPI busy-polls while a rank waits in MPI (Horovod's background thread negotiates in a blocking MPI
# collective every 0.2 ms cycle under hvdkit), and it yields the core only when it sees more ranks than
# slots: 2 ranks on 2 cores is not that, yet each rank also runs torch's or TensorFlow's threads, so the
# polling took CPU from the ranks' own work. Measured side by side on the 2-core machine (2026-12-02):
# examples/torch_digits.py under mpirun -np 2 7.2 and 7.1 s polling, 5.6 and 5.2 s yielding; the TF2
# synthetic benchmark 40.9 s and 35.0 s. Scheduling only; no test asserts a time. A value set wins.
os.environ.setdefault("OMPI_MCA_mpi_yield_when_idle", "1")


@pytest.fixture(autouse=True)
def _no_leaked_env():
    """Fail a test that leaves an environment variable changed (as Lightning's conftest does)."""
    before = dict(os.environ)
    yield
    after = dict(os.environ)
    changed = {k for k in before.keys() | after.keys() if before.get(k) != after.get(k)} - {"PYTEST_CURRENT_TEST"}
    assert not changed, f"test leaked environment changes: {sorted(changed)}"


# `make test` runs two pytest workers (pytest-xdist, `-n 2 --dist loadgroup`): every test that starts
# processes stays on one worker, in file order, as in a single run (the module fixtures, the pool's jobs and
# the session's reference runs are made once, and no two jobs compete for the 2 cores); the unit tests, pure
# logic in their own process, go to the other worker, into the time the first one waits on its jobs (the
# cores were idle 30 % of a single-worker run). So do the modules in ALONGSIDE: their jobs spend most of their
# time waiting by design (paced steps, Gloo's timeout after a killed worker), and they assert no timing (they
# passed under loads of 5-10 before, as every test must). The groups are made here rather than by xdist_group
# marks: pytest-xdist 3.8 groups by rewriting a test's node id, which pytest 9 no longer reads.
JOBS_GROUP = "jobs"
ALONGSIDE = (
    "tests/e2e/test_in_process_recovery.py",
    "tests/e2e/test_in_process_recovery_keras.py",
    "tests/e2e/test_bench_chaos.py",
)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class JobsOnOneWorker(LoadScopeScheduling):
        """One work unit of every test that starts processes (in collection order); a module each of the unit
        tests and of ALONGSIDE."""

        def _split_scope(self, nodeid: str) -> str:
            module = nodeid.split("::", 1)[0]
            return module if module.startswith("tests/unit/") or module in ALONGSIDE else JOBS_GROUP

    return JobsOnOneWorker(config, log)


# Where the suite's time goes (issue 38): seconds per test folder (setup + call + teardown of every
# test in it, module fixtures included), printed after the run; `make test` adds --durations=30.
_FOLDER_SECONDS: dict[str, float] = {}
_FOLDER_TESTS: dict[str, int] = {}


def _folder(nodeid):
    path = nodeid.split("::", 1)[0]
    parts = path.split("/")
    return "/".join(parts[:2]) if len(parts) > 2 else path


def pytest_runtest_logreport(report):
    folder = _folder(report.nodeid)
    _FOLDER_SECONDS[folder] = _FOLDER_SECONDS.get(folder, 0.0) + report.duration
    if report.when == "call":
        _FOLDER_TESTS[folder] = _FOLDER_TESTS.get(folder, 0) + 1


def pytest_terminal_summary(terminalreporter):
    if not _FOLDER_SECONDS:
        return
    total = sum(_FOLDER_SECONDS.values())
    terminalreporter.write_sep("=", "time per test folder")
    for folder, seconds in sorted(_FOLDER_SECONDS.items(), key=lambda item: -item[1]):
        share = 100 * seconds / total if total else 0.0
        count = _FOLDER_TESTS.get(folder, 0)
        terminalreporter.write_line(f"{seconds:8.1f} s  {share:5.1f} %  {count:5d} tests  {folder}")
    terminalreporter.write_line(f"{total:8.1f} s  100.0 %  {sum(_FOLDER_TESTS.values()):5d} tests  (all)")
    pool = sys.modules.get("pool")
    if pool is not None and hasattr(pool, "summary"):
        terminalreporter.write_line(pool.summary())
    for line in _WORKER_POOL_SUMMARIES:  # under pytest-xdist: the pool lives in a worker
        terminalreporter.write_line(line)


_WORKER_POOL_SUMMARIES: list[str] = []


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    """pytest-xdist, in the controller: a worker ended; keep its pool summary for the terminal summary."""
    line = getattr(node, "workeroutput", {}).get("pool_summary")
    if line:
        _WORKER_POOL_SUMMARIES.append(line)


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item, nextitem):
    """Park the pool's jobs when the last test of a module is done (tests/support/pool.py). An idle pool job
    is not free: Horovod's background loop and MPI's progress keep its ranks busy (up to 88 % of a core for
    an idle Keras job under mpirun, measured during a full run), so jobs left running for later modules
    took most of the 2 cores from the tests that ran meanwhile. Parked (SIGSTOP), they cost nothing until
    a later module's case wakes them, and no module pays for a job start the pool already paid."""
    if nextitem is not None and nextitem.path == item.path:
        return
    pool = sys.modules.get("pool")
    if pool is not None and hasattr(pool, "park_all"):
        pool.park_all()


def pytest_sessionfinish(session):
    """End the pool's long-lived jobs (tests/support/pool.py), if a test used it: no process outlives the session."""
    pool = sys.modules.get("pool")
    if pool is not None and getattr(pool, "STARTED", None) and hasattr(session.config, "workeroutput"):
        session.config.workeroutput["pool_summary"] = pool.summary()  # an xdist worker: to the controller
    if pool is not None and hasattr(pool, "close_all"):
        pool.close_all()
