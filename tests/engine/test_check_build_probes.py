"""Horovod's build checks import each framework extension once (engine fix 19).

`horovodrun --check-build` (and `hvdkit doctor`, which runs it) started a new process that imported the
extension for every line it printed: TensorFlow six times, 18 s on 2 cores. `horovodrun --gloo` asks
`gloo_built()` before it starts any rank, and asked TensorFlow, the costliest import. Now one process per
extension answers every build question, and the build questions ask PyTorch first (every extension of a
build is compiled with the same settings); the report is unchanged.
"""

import json
import subprocess

from helpers import PYTHON, ROOT

SCRIPT = ROOT / "tests" / "engine" / "scripts" / "check_build_probes.py"


def probes(what):
    done = subprocess.run([PYTHON, str(SCRIPT), what], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_check_build_imports_each_extension_once_and_reports_every_part():
    got = probes("check-build")
    assert sorted(got["started"]) == ["mxnet", "tensorflow", "torch"]  # was 8 processes, 6 of them TensorFlow
    lines = {line.strip() for line in got["report"].splitlines()}
    for part in ("TensorFlow", "PyTorch", "MPI", "Gloo"):
        assert f"[X] {part}" in lines, got["report"]
    for part in ("MXNet", "NCCL", "DDL", "CCL"):
        assert f"[ ] {part}" in lines, got["report"]


def test_the_gloo_check_before_a_launch_imports_pytorch_only():
    got = probes("gloo")
    assert got == {"gloo_built": True, "started": ["torch"]}  # was ["tensorflow"]: 3.7 s against 1.3 s here
