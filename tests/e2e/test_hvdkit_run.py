"""End to end: real jobs started through `hvdkit run`, checked by exit code, output and files."""

import os
import socket

import pytest
from helpers import (
    HVDKIT,
    PYTHON,
    fixed_compression,  # noqa: F401 - autouse: HVDKIT_COMPRESSION=fp16 for this module's runs
    hvdkit_run,
    result_line,
    run_bounded,
)

pytestmark = pytest.mark.dist
EXAMPLE = "examples/torch_digits.py"
BEHAVE = "tests/e2e/scripts/rank_behaviour.py"


@pytest.fixture(scope="module")
def demo(torch_demo, tmp_path_factory):
    """The README's demo with default flags, on 2 ranks over MPI (the session's run, tests/e2e/conftest.py), and
    this module's own copy of its checkpoints (a test here resumes in them)."""
    ckpt = torch_demo.copy_to(tmp_path_factory.mktemp("demo") / "ckpt")
    return {"proc": torch_demo.proc, "ckpt": ckpt, "result": torch_demo.result}


def test_demo_reaches_95_percent_validation_accuracy_on_two_ranks(demo):
    r = demo["result"]
    assert r["world_size"] == 2 and r["epochs"] == 12 and r["resumed_from_epoch"] == 0
    assert r["val_accuracy"] >= 0.95
    assert 0 < r["val_loss"] < 0.3
    assert r["compression"] == "fp16"  # what "auto" resolved to (HVDKIT_COMPRESSION pins it in this module)


def test_demo_output_is_tagged_by_rank_and_progress_is_logged_on_rank0_only(demo):
    err = demo["proc"].stderr
    assert "[rank 0/2] hvdkit.trainer: epoch 12/12" in err
    assert "[rank 1/2] hvdkit.trainer: epoch" not in err


def test_demo_keeps_the_newest_three_checkpoints(demo):
    assert sorted(os.listdir(demo["ckpt"])) == [".hvdkit.lock"] + [f"ckpt-{s:012d}" for s in (230, 253, 276)]


def test_rerun_resumes_after_the_last_epoch_and_reports_the_same_model(demo):
    proc = hvdkit_run("-np", "2", "--", PYTHON, EXAMPLE, "--checkpoint-dir", str(demo["ckpt"]))
    assert proc.returncode == 0, proc.stderr
    again = result_line(proc.stdout)
    assert again["resumed_from_epoch"] == 12 and again["steps"] == demo["result"]["steps"]
    assert again["preempted"] is False and "hvdkit.trainer: epoch" not in proc.stderr  # nothing left to train
    assert (again["val_accuracy"], again["val_loss"]) == (demo["result"]["val_accuracy"], demo["result"]["val_loss"])


# A resume from an earlier epoch ending bitwise where the uninterrupted demo ended is test_fault_tolerance's
# (the flipped-bytes fallback resumes from epoch 11, the SIGTERM test mid-epoch 8); the demo over Gloo is no other
# maths than over MPI, and `hvdkit run --gloo` trains the torch example to the end in test_in_process_recovery.py.


@pytest.mark.parametrize("gloo", [False, True], ids=["mpi", "gloo"])
def test_a_failing_rank_ends_the_job_with_its_exit_code_and_is_named(gloo):
    proc = hvdkit_run("-np", "2", *(["--gloo"] if gloo else []), "--", PYTHON, BEHAVE, "exit", "1", "3", timeout=90)
    assert proc.returncode == 3
    assert "hvdkit run: rank 1 exited with code 3" in proc.stderr
    assert "[rank 1] rank 1 failing on purpose" in proc.stderr


def test_a_rank_killed_by_sigkill_is_named_with_the_signal():
    proc = hvdkit_run("-np", "2", "--", PYTHON, BEHAVE, "kill", "1", timeout=90)
    assert proc.returncode == 128 + 9
    assert "rank 1 was killed by SIGKILL" in proc.stderr


def test_each_ranks_output_is_tagged_with_its_rank():
    proc = hvdkit_run("-np", "2", "--", PYTHON, BEHAVE, "hello", timeout=90)
    assert proc.returncode == 0
    assert "[rank 0] hello from rank 0" in proc.stdout and "[rank 1] hello from rank 1" in proc.stdout


def test_dry_run_prints_the_exact_mpirun_command_and_starts_nothing():
    proc = hvdkit_run("-np", "3", "--dry-run", "--", "python", EXAMPLE, "--epochs", "1", timeout=30)
    assert proc.returncode == 0
    words = proc.stdout.split()
    assert words[0].endswith("mpirun") and words[1:3] == ["-np", "3"]
    assert ("--allow-run-as-root" in words) == (os.geteuid() == 0)
    assert ("--oversubscribe" in words) == (3 > len(os.sched_getaffinity(0)))
    # the program as the launching shell finds it (its virtualenv's python, by full path): every rank runs that
    assert words[-4:] == [os.path.join(os.path.dirname(PYTHON), "python"), EXAMPLE, "--epochs", "1"]


@pytest.mark.parametrize(
    "args, message",
    [
        (["-np", "0", "--", "python", EXAMPLE], "-np must be an integer >= 1 (got 0)"),
        (["-np", "2", "--", "python", "examples/nope.py"], "script 'examples/nope.py' not found"),
        (["-np", "2"], "no command given"),
    ],
    ids=["np-0", "missing-script", "no-command"],
)
def test_bad_launch_input_is_a_clear_error_before_anything_starts(args, message):
    proc = hvdkit_run(*args, timeout=30)
    assert proc.returncode == 2
    assert message in proc.stderr


def test_unknown_compression_name_fails_on_every_rank_with_the_choices(tmp_path):
    proc = hvdkit_run("-np", "2", "--", PYTHON, EXAMPLE, "--compression", "bf16", "--checkpoint-dir", str(tmp_path))
    assert proc.returncode == 2
    assert "compression must be one of 'none', 'fp16', 'auto' (got 'bf16')" in proc.stderr
    assert "hvdkit run: rank" in proc.stderr


def test_unwritable_checkpoint_directory_fails_before_training(tmp_path):
    (tmp_path / "a-file").write_text("x")
    bad = tmp_path / "a-file" / "ckpt"
    proc = hvdkit_run("-np", "2", "--", PYTHON, EXAMPLE, "--checkpoint-dir", str(bad))
    assert proc.returncode == 2
    assert f"checkpoint directory '{bad}' is not writable" in proc.stderr
    assert "epoch 1/" not in proc.stderr


def test_doctor_reports_versions_build_and_a_passing_smoke_test():
    proc = run_bounded([HVDKIT, "doctor"], 300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    for needle in ("torch ", "2.13.0", "tensorflow", "2.21.0", "horovod", "0.28.1", "Open MPI"):
        assert needle in out
    assert "2-rank allreduce (mpi)     ok (sum over 2 ranks = 3)" in out
    assert "2-rank allreduce (gloo)    ok (sum over 2 ranks = 3)" in out
    assert out.rstrip().endswith("all checks passed")


def test_an_elastic_run_makes_the_folder_of_its_timeline(tmp_path):
    """Horovod records nothing (one log line) when the timeline's folder is missing; elastic runs never made it."""
    timeline = tmp_path / "new" / "timeline.json"
    proc = hvdkit_run(
        "-np",
        "1",
        "--min-np",
        "1",
        "--max-np",
        "1",
        "-H",
        "localhost:1",
        "--timeline",
        str(timeline),
        "--",
        PYTHON,
        "-c",
        "import hvdkit.torch as hk; hk.init()",
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert timeline.is_file()  # Horovod opened it (it writes events as they come: none here)


@pytest.mark.parametrize(("controller", "hosts"), [("mpi", None), ("gloo", None), ("mpi", "hostname")])
def test_a_bare_python3_is_the_launching_shells_virtualenv_python_on_every_rank(controller, hosts):
    # mpirun by its full path acts as if given --prefix /usr: the ranks' PATH began with /usr/bin and
    # `hvdkit run -- python3 train.py` ran the system's python (on a GPU machine: No module named 'torch').
    # With -H $(hostname):2 (as a one-node SLURM allocation gives) too: this machine by another name.
    bin_dir = os.path.dirname(PYTHON)
    env = dict(os.environ, PATH=f"{bin_dir}:/usr/local/bin:/usr/bin:/bin")
    show = "import os, shutil, sys; print('seen', sys.executable, shutil.which('python3'))"
    flags = ["--gloo"] if controller == "gloo" else []
    if hosts == "hostname":
        flags += ["-H", f"{socket.gethostname()}:2"]
    proc = run_bounded([HVDKIT, "run", "-np", "2", *flags, "--", "python3", "-c", show], 180, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    seen = sorted(line.split("seen ", 1)[1] for line in proc.stdout.splitlines() if "seen " in line)
    want = os.path.join(bin_dir, "python3")
    assert seen == [f"{want} {want}"] * 2, proc.stdout
