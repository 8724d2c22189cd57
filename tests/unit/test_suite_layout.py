import json
import subprocess
import sys

from helpers import ROOT


def test_pytest_collects_the_distributed_and_end_to_end_suites():
    # pytest skips folders named "dist" or "build" by default: a renamed folder must not vanish silently.
    # The walk is pytest's own; the files are not imported (tests/support/reached_files.py).
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-s", "-p", "reached_files", "tests"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    ).stdout
    files = {line.split(" ", 1)[1] for line in out.splitlines() if line.startswith("reached ")}
    assert len(files) == len(list((ROOT / "tests").rglob("test_*.py"))), out[-2000:]
    for expected in (
        "tests/distributed/test_torch_contracts.py",
        "tests/distributed/test_keras_contracts.py",
        "tests/e2e/test_hvdkit_run.py",
        "tests/e2e/test_tf_examples.py",
        "tests/e2e/test_fault_tolerance.py",
        "tests/multihost/test_two_hosts.py",
        "tests/distributed/test_tracking_contracts.py",
        "tests/distributed/test_straggler_contracts.py",
        "tests/distributed/test_lr_and_clipping.py",
        "tests/e2e/test_hvdkit_timeline.py",
        "tests/e2e/test_bench.py",
        "tests/e2e/test_quickstarts.py",
    ):
        assert expected in files


def test_no_two_test_files_share_a_name():
    # pytest imports test files by their base name (no packages here): a second file of the same name
    # in another folder stops the whole run at collection ("import file mismatch").
    names = {}
    for path in sorted((ROOT / "tests").rglob("test_*.py")):
        names.setdefault(path.name, []).append(str(path.relative_to(ROOT)))
    assert {name: paths for name, paths in names.items() if len(paths) > 1} == {}


def _root_conftest():
    """tests/conftest.py as a module of its own (pytest registers several modules named conftest)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("suite_conftest", ROOT / "tests" / "conftest.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _modules(folder):
    return sorted(str(p.relative_to(ROOT)) for p in (ROOT / "tests" / folder).glob("test_*.py"))


def test_the_job_tests_run_in_two_lanes_and_what_they_must_share_is_in_one():
    conftest = _root_conftest()
    unit = conftest.work_unit
    # a unit test module and an ALONGSIDE module are units of their own
    assert unit("tests/unit/core/test_data.py::test_x") == "tests/unit/core/test_data.py"
    for module in conftest.ALONGSIDE:
        assert unit(f"{module}::test_x") == module
    # every other module of a job folder is in a lane; both lanes are used
    lanes = {
        unit(f"{m}::t")
        for folder in ("distributed", "engine", "e2e", "multihost")
        for m in _modules(folder)
        if m not in conftest.ALONGSIDE
    }
    assert lanes == set(conftest.LANES)
    # the session's reference runs (tests/e2e/conftest.py) are made once per worker: their users share a lane
    users = [m for m in _modules("e2e") if "torch_demo" in (ROOT / m).read_text() and m not in conftest.ALONGSIDE]
    assert len(users) >= 3 and len({unit(f"{m}::t") for m in users}) == 1, users
    # the modules that start Ray's local cluster run one at a time
    ray = [
        m
        for folder in ("distributed", "engine", "e2e", "multihost")
        for m in _modules(folder)
        if any(word in (ROOT / m).read_text() for word in ("import ray", "ray.tune", "horovod.ray"))
    ]
    assert len(ray) >= 2 and len({unit(f"{m}::t") for m in ray}) == 1, ray


_RECORD = """
import sys
sys.path[:0] = [sys.argv[1] + "/tests/support"]
from helpers import record_figures
for i in range(int(sys.argv[4])):
    record_figures(f"{sys.argv[3]}-{i}", path=sys.argv[2], seconds=i)
"""


def test_fault_tests_in_two_lanes_record_their_figures_without_losing_a_row(tmp_path):
    path = tmp_path / "reliability.json"
    writers, rows = 4, 40
    procs = [
        subprocess.Popen([sys.executable, "-c", _RECORD, str(ROOT), str(path), f"w{w}", str(rows)])
        for w in range(writers)
    ]
    assert [p.wait(timeout=120) for p in procs] == [0] * writers
    recorded = json.loads(path.read_text())
    assert sorted(r["test"] for r in recorded) == sorted(f"w{w}-{i}" for w in range(writers) for i in range(rows))
