"""Two real jobs (2 ranks each, under mpirun) on one checkpoint folder: the second is refused on
every rank with the holder named, the first's checkpoints are untouched, the lock ends with the job."""

import json
import os
import signal
import subprocess
import time

import pytest
from helpers import BIN, PYTHON, ROOT, launcher_argv, record_figures, run_bounded

from hvdkit.core import CheckpointStore, LocalCommunicator
from hvdkit.core.checkpoint import verify

pytestmark = pytest.mark.dist
SCRIPT = str(ROOT / "tests" / "e2e" / "scripts" / "checkpoint_job.py")
TIMEOUT = 300


def start(argv):
    env = dict(os.environ, PYTHONUNBUFFERED="1", PATH=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}")
    return subprocess.Popen(
        argv,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=ROOT,
        start_new_session=True,
        stdin=subprocess.DEVNULL,
    )


def wait_for(path, proc):
    deadline = time.monotonic() + TIMEOUT
    while not path.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            os.killpg(proc.pid, signal.SIGKILL)
            out, err = proc.communicate()
            pytest.fail(f"the first job never held the folder:\n{out[-3000:]}\n{err[-3000:]}")
        time.sleep(0.2)


@pytest.fixture(scope="module")
def jobs(tmp_path_factory):
    out = tmp_path_factory.mktemp("two-jobs")
    ckpt = out / "ckpt"
    first = start(launcher_argv("mpirun", 2) + [PYTHON, SCRIPT, str(ckpt), str(out), "holder"])
    try:
        wait_for(out / "holding", first)
        before = sorted(os.listdir(ckpt))
        t0 = time.perf_counter()
        second = run_bounded(launcher_argv("mpirun", 2) + [PYTHON, SCRIPT, str(ckpt), str(out), "second"], TIMEOUT)
        second_wall = time.perf_counter() - t0
        during = sorted(os.listdir(ckpt))
        (out / "release").touch()
        first_out, first_err = first.communicate(timeout=TIMEOUT)
    finally:
        try:
            os.killpg(first.pid, signal.SIGKILL)  # no rank outlives the test
        except ProcessLookupError:
            pass
    return {
        "out": out,
        "ckpt": ckpt,
        "before": before,
        "during": during,
        "second": second,
        "second_wall": second_wall,
        "first": (first.returncode, first_out, first_err),
        "holding": json.loads((out / "holding").read_text()),
    }


def records(out, role):
    return [json.loads((out / f"{role}-rank{r}.json").read_text()) for r in range(2)]


def test_a_second_job_on_a_folder_in_use_fails_on_every_rank_naming_the_holder(jobs):
    second = jobs["second"]
    assert second.returncode != 0, second.stdout + second.stderr
    holder = jobs["holding"]
    rank_records = records(jobs["out"], "second")
    for rec in rank_records:
        assert f"is in use by another job: host {holder['host']}, pid {holder['pid']}, job " in rec["error"]
        assert "give this job its own directory (--checkpoint-dir)" in rec["error"]
    assert rank_records[0]["error"] == rank_records[1]["error"]  # rank 0's finding, broadcast
    assert "CheckpointError" in second.stderr and f"pid {holder['pid']}" in second.stderr
    record_figures(
        "checkpoint_second_job_refused",
        second_job_wall_s=round(jobs["second_wall"], 2),
        refused_after_s=round(max(r["seconds"] for r in rank_records), 4),
        message=rank_records[0]["error"],
    )


def test_the_first_jobs_checkpoints_are_untouched_and_it_goes_on_saving(jobs):
    assert jobs["before"] == jobs["during"] == [".hvdkit.lock", "ckpt-000000000001", "ckpt-000000000002"]
    code, out, err = jobs["first"]
    assert code == 0, out[-3000:] + err[-3000:]
    assert records(jobs["out"], "holder")[0]["saved"] == [f"ckpt-{s:012d}" for s in range(1, 6)]
    assert [verify(str(jobs["ckpt"] / f"ckpt-{s:012d}"))["step"] for s in (4, 5)] == [4, 5]


def test_the_lock_ends_with_the_job_and_the_next_one_takes_the_folder(jobs):
    store = CheckpointStore(jobs["ckpt"], LocalCommunicator(), keep=2)
    try:
        assert [step for step, _ in store.candidates()] == [5, 4]
        assert f'"pid": {os.getpid()}' in (jobs["ckpt"] / ".hvdkit.lock").read_text()
    finally:
        store.close()
