"""`hvdkit run` output a user reads: hvdkit's lines, not TensorFlow's start-up chatter, and one
failure report, not the launcher's banner after it (HVDKIT_LOG_LEVEL=DEBUG shows everything)."""

import pytest
from helpers import HVDKIT, PYTHON, run_bounded

pytestmark = pytest.mark.dist

# Rank 1 imports TensorFlow (its start-up INFO lines go to stderr), then fails; rank 0 waits.
SCRIPT = """
import os, sys, time
rank = int(os.environ.get("OMPI_COMM_WORLD_RANK", os.environ.get("HOROVOD_RANK", "0")))
import tensorflow as tf
tf.constant(1.0) + 1.0
print(f"rank {rank} ready", flush=True)
if rank == 1:
    sys.exit(3)
time.sleep(5)
"""
MPIRUN_BANNER = "mpirun detected that one or more processes exited"
HOROVODRUN_REPORT = "Horovod detected that one or more processes exited"
# TensorFlow's start-up lines: absl's notice comes on every CPU, oneDNN's only where TensorFlow turns
# oneDNN on (not on an AVX2-only CPU), cpu_feature_guard's where the binary lacks instructions it could use
CHATTER = ("absl::InitializeLog()", "oneDNN custom operations are on", "cpu_feature_guard.cc")


@pytest.fixture(scope="module")
def script(tmp_path_factory):
    path = tmp_path_factory.mktemp("quiet") / "fails_on_rank_1.py"
    path.write_text(SCRIPT)
    return path


def run(script, gloo=False, **env):
    argv = [HVDKIT, "run", "-np", "2", *(["--gloo"] if gloo else []), "--", PYTHON, str(script)]
    # TensorFlow logs its start-up INFO lines: whatever this process inherited (importing hvdkit.tensorflow,
    # as the unit tests' collection does, sets TF_CPP_MIN_LOG_LEVEL=2), so the filter has chatter to drop
    return run_bounded(argv, 300, env={"TF_CPP_MIN_LOG_LEVEL": "0", **env})


@pytest.mark.parametrize("gloo", [False, True], ids=["mpirun", "horovodrun-gloo"])
def test_a_failing_job_shows_one_report_and_no_start_up_chatter(script, gloo):
    proc = run(script, gloo=gloo)
    assert proc.returncode == 3, proc.stderr
    assert "[rank 1] rank 1 ready" in proc.stdout, proc.stdout  # the ranks' own lines pass
    reports = [line for line in proc.stderr.splitlines() if line.startswith("hvdkit run: rank 1 exited with code 3")]
    assert len(reports) == 1, proc.stderr
    for text in (MPIRUN_BANNER, HOROVODRUN_REPORT, "Traceback", *CHATTER):
        assert text not in proc.stderr, proc.stderr


def test_debug_level_shows_the_chatter_and_the_launchers_own_report(script):
    proc = run(script, HVDKIT_LOG_LEVEL="DEBUG")
    assert proc.returncode == 3, proc.stderr
    assert MPIRUN_BANNER in proc.stderr and "absl::InitializeLog()" in proc.stderr, proc.stderr
    assert "hvdkit run: rank 1 exited with code 3" in proc.stderr


def test_more_ranks_than_cores_is_said_once(script):
    import os

    cores = len(os.sched_getaffinity(0))
    proc = run_bounded([HVDKIT, "run", "-np", str(cores + 1), "--dry-run", "--", PYTHON, str(script)], 60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.count(f"{cores + 1} ranks on {cores} CPU cores here") == 1, proc.stderr
    assert "--oversubscribe" in proc.stdout
    fits = run_bounded([HVDKIT, "run", "-np", str(cores), "--dry-run", "--", PYTHON, str(script)], 60)
    assert "CPU cores here" not in fits.stderr
