"""Fixtures shared by every test."""

import os
import sys

import pytest

# MLflow 3 starts a usage-telemetry thread on import that sets, and later may unset,
# _MLFLOW_TELEMETRY_SESSION_ID at a moment of its choosing (a spurious "leak" below), and tries to
# reach the internet. Off for the whole test session and the ranks it starts.
os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")


@pytest.fixture(autouse=True)
def _no_leaked_env():
    """Fail a test that leaves an environment variable changed (as Lightning's conftest does)."""
    before = dict(os.environ)
    yield
    after = dict(os.environ)
    changed = {k for k in before.keys() | after.keys() if before.get(k) != after.get(k)} - {"PYTEST_CURRENT_TEST"}
    assert not changed, f"test leaked environment changes: {sorted(changed)}"


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
    if pool is not None and hasattr(pool, "close_all"):
        pool.close_all()
