"""``hvdkit.launcher.run_job`` from code: the job runner behind ``hvdkit run``, with real ranks under mpirun."""

import io
import json
import os
import sys

import pytest

from hvdkit.launcher import JobSpec, RunOptions, run_job

pytestmark = pytest.mark.dist

# Each rank writes what the runner gave it; rank 1 of the first attempt fails.
RANK = """
import json, os, sys
rank, out = os.environ["OMPI_COMM_WORLD_RANK"], sys.argv[1]
keys = ("HVDKIT_RESTART", "HVDKIT_WORLD_SIZE", "HVDKIT_STALL_TIMEOUT", "HVDKIT_MEMBERSHIP_CHANGES", "NOTE")
with open(os.path.join(out, f"attempt{os.environ['HVDKIT_RESTART']}-rank{rank}.json"), "w") as f:
    json.dump({k: os.environ.get(k) for k in keys}, f)
sys.exit(3 if rank == "1" and os.environ["HVDKIT_RESTART"] == "0" else 0)
"""


def test_run_job_from_code_relaunches_a_failed_attempt_with_its_number_and_says_what_failed(tmp_path):
    spec = JobSpec(command=[sys.executable, "-c", RANK, str(tmp_path)], num_proc=2, env={"NOTE": "from code"})
    err = io.StringIO()
    assert run_job(spec, RunOptions(max_restarts=1, stall_timeout=42), err=err) == 0
    seen = {name: json.loads((tmp_path / name).read_text()) for name in sorted(os.listdir(tmp_path))}
    assert sorted(seen) == ["attempt0-rank0.json", "attempt0-rank1.json", "attempt1-rank0.json", "attempt1-rank1.json"]
    for name, got in seen.items():
        attempt = name[len("attempt")]
        assert got == {
            "HVDKIT_RESTART": attempt,
            "HVDKIT_WORLD_SIZE": "2",
            "HVDKIT_STALL_TIMEOUT": "42",
            "HVDKIT_MEMBERSHIP_CHANGES": None,
            "NOTE": "from code",
        }
    lines = err.getvalue().splitlines()
    assert lines[0].startswith("hvdkit run: rank 1 exited with code 3 on ") and lines[0].endswith("; restarting (1/1)")
    assert lines[1].startswith("hvdkit run: job finished after 1 restart used (attempt 1: rank 1 exited with code 3")
    assert len(lines) == 2


def test_run_job_from_code_ends_with_the_failing_ranks_exit_code_when_no_restart_is_left(tmp_path):
    spec = JobSpec(command=[sys.executable, "-c", RANK, str(tmp_path)], num_proc=2)
    err = io.StringIO()
    assert run_job(spec, RunOptions(max_restarts=0), err=err) == 3
    assert sorted(os.listdir(tmp_path)) == ["attempt0-rank0.json", "attempt0-rank1.json"]
    (line,) = err.getvalue().splitlines()
    assert line.startswith("hvdkit run: rank 1 exited with code 3 on ") and line.endswith("; job stopped (exit code 3)")


def test_run_options_are_frozen_and_a_dry_run_starts_nothing(tmp_path, capsys):
    options = RunOptions(dry_run=True, stall_timeout=5)
    with pytest.raises(AttributeError):
        options.max_restarts = 3  # type: ignore[misc]
    spec = JobSpec(command=[sys.executable, "-c", RANK, str(tmp_path)], num_proc=2)
    assert run_job(spec, options) == 0
    argv = capsys.readouterr().out.split()
    assert argv[0].endswith("mpirun") and "HVDKIT_STALL_TIMEOUT" in " ".join(argv) and os.listdir(tmp_path) == []
