import subprocess
import sys

from helpers import ROOT


def test_pytest_collects_the_distributed_and_end_to_end_suites():
    # pytest skips folders named "dist" or "build" by default: a renamed folder must not vanish silently.
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "tests"], cwd=ROOT, capture_output=True, text=True
    ).stdout
    files = {line.split("::")[0] for line in out.splitlines() if "::" in line}
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
