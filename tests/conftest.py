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
# Every process the suite starts (the pytest workers, ranks, launchers) runs tests/support/startup/sitecustomize.py:
# Keras without its optional scikit-learn, pandas and matplotlib integrations, about 2.3 s of CPU less per
# TensorFlow process (its docstring has the measurement; users' processes are untouched).
STARTUP = os.path.join(os.path.dirname(os.path.abspath(__file__)), "support", "startup")
os.environ["PYTHONPATH"] = os.pathsep.join(
    [STARTUP, *(p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and p != STARTUP)]
)


@pytest.fixture(autouse=True)
def _no_leaked_env():
    """Fail a test that leaves an environment variable changed (as Lightning's conftest does)."""
    before = dict(os.environ)
    yield
    after = dict(os.environ)
    changed = {k for k in before.keys() | after.keys() if before.get(k) != after.get(k)} - {"PYTEST_CURRENT_TEST"}
    assert not changed, f"test leaked environment changes: {sorted(changed)}"


# `make test` runs three pytest workers (pytest-xdist, `-n 3 --dist loadgroup`). The tests that start processes
# run in two lanes, one worker each, every lane in file order as in a single run (its module fixtures, the pool's
# jobs and the session's reference runs are made once in it): a 2-rank job here waits far more than it
# computes (collectives, Horovod's cycle, paced steps, timeouts after a killed worker), so two lanes at once get
# through their jobs in about half the time: side by side on the 2-core machine (2026-12-07), two runs of
# examples/torch_digits.py under mpirun -np 2 took 49.7 s one after the other and 26.6 s at once. The unit
# tests, pure logic in their own process, go to the third worker, a module at a time; so do the modules in
# ALONGSIDE: those whose jobs spend most of their time waiting by design (paced steps, Gloo's timeout after a
# killed worker), and four that balance the three workers (measured on 2026-12-07 with two lanes only: the lanes
# took 2,643 and 2,684 s of tests, the third worker 1,446 s; these four took 467 s of one lane and 427 s of the
# other). No test asserts a time, and every one must pass under load (the suite ran under loads of 4-13).
# What two lanes share at once must be safe to share: names and addresses made from the worker's pid (network
# namespaces), free ports, files under tmp_path; build/reliability.json takes a lock (helpers.record_figures);
# the modules that start Ray's local cluster share a lane (LANE_OF_MODULE).
# The groups are made here rather than by xdist_group marks: pytest-xdist 3.8 groups by rewriting a test's
# node id, which pytest 9 no longer reads.
LANE_OF_FOLDER = {
    "tests/distributed": "jobs-1",
    "tests/engine": "jobs-1",
    "tests/e2e": "jobs-2",
    "tests/multihost": "jobs-2",
}
LANE_OF_MODULE = {
    # Ray's local cluster: with hvdkit tune's Ray test, one at a time
    "tests/engine/test_horovod_ray_executor.py": "jobs-2",
}
LANES = ("jobs-1", "jobs-2")
DEFAULT_LANE = "jobs-1"  # a folder of job tests not listed (tests/gpu: skipped without a GPU)
ALONGSIDE = (
    "tests/e2e/test_in_process_recovery.py",
    "tests/e2e/test_in_process_recovery_keras.py",
    "tests/e2e/test_in_process_recovery_keras_amp.py",
    "tests/e2e/test_bench_chaos.py",
    "tests/e2e/test_bench_network.py",  # a shaped link: mostly waiting
    "tests/e2e/test_bench.py",
    "tests/distributed/test_world_size_change_keras.py",
    "tests/distributed/test_lr_world_size_changes.py",
)


def work_unit(nodeid: str) -> str:
    """The scheduling unit of a test: its module for a unit test or a module in ALONGSIDE, else its job lane."""
    module = nodeid.split("::", 1)[0]
    if module.startswith("tests/unit/") or module in ALONGSIDE:
        return module
    if module in LANE_OF_MODULE:
        return LANE_OF_MODULE[module]
    return LANE_OF_FOLDER.get(_folder(module), DEFAULT_LANE)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class JobLanes(LoadScopeScheduling):
        """One work unit per job lane (its tests in collection order); a module each of the unit tests and of
        ALONGSIDE. The lanes go out first, a worker each; then the rest, largest first (--loadscope-reorder)."""

        def _split_scope(self, nodeid: str) -> str:
            return work_unit(nodeid)

        def _assign_work_unit(self, node) -> None:
            lanes = [scope for scope in self.workqueue if scope in LANES]
            if lanes:
                self.workqueue.move_to_end(lanes[0], last=False)
            super()._assign_work_unit(node)

    return JobLanes(config, log)


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
