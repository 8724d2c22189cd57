"""A job never outlives `hvdkit run`: however the launcher dies, mpirun (or horovodrun) and every
rank end within seconds, and nothing is left in its temp folder.

Each job is 2 real ranks that record every pid of the job (themselves, their wrappers, mpirun or
horovodrun's helpers) and would then sleep for 10 minutes. The launcher is SIGKILLed, hung up on
(SIGHUP, as when its terminal or ssh session closes), or its whole process group is SIGKILLed.
"""

import json
import os
import signal
import subprocess
import time

import pytest
from helpers import BIN, HVDKIT, PYTHON, ROOT, end_job, pid_running, record_figures, wait_until_gone

pytestmark = pytest.mark.dist
SCRIPT = str(ROOT / "tests" / "e2e" / "scripts" / "record_job_pids.py")
BOUND = 60  # seconds; "a few seconds" measured, the bound only tells a hang from a slow machine


def kill_launcher(proc, how):
    if how == "sigkill":
        os.kill(proc.pid, signal.SIGKILL)
    elif how == "sighup":
        os.kill(proc.pid, signal.SIGHUP)
    else:  # the launcher leads its own process group here (as a shell's job would)
        os.killpg(proc.pid, signal.SIGKILL)


def wait_for_records(out, proc, timeout=240):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        files = [out / f"rank-{r}.json" for r in (0, 1)]
        if all(f.exists() for f in files):
            return [json.loads(f.read_text()) for f in files]
        if proc.poll() is not None:
            break
        time.sleep(0.2)
    pytest.fail(f"the ranks did not start (launcher exit code {proc.poll()})")


@pytest.mark.parametrize("how", ["sigkill", "sighup", "process-group"])
@pytest.mark.parametrize("controller", ["mpi", "gloo"])
def test_every_process_of_the_job_ends_within_seconds_of_the_launchers_death(tmp_path, controller, how):
    tmpdir, out = tmp_path / "tmp", tmp_path / "pids"
    tmpdir.mkdir()
    out.mkdir()
    env = dict(os.environ, TMPDIR=str(tmpdir), PYTHONUNBUFFERED="1", PATH=f"{BIN}{os.pathsep}{os.environ['PATH']}")
    gloo = ["--gloo"] if controller == "gloo" else []
    argv = [HVDKIT, "run", "-np", "2", *gloo, "--", PYTHON, SCRIPT, str(out), str(os.getpid())]
    with open(tmp_path / "launcher.log", "w") as log:
        proc = subprocess.Popen(
            argv,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            cwd=ROOT,
            start_new_session=True,
        )
    job = set()
    try:
        records = wait_for_records(out, proc)
        assert all(r["reached_launcher"] for r in records)
        job = {pid for r in records for pid in r["pids"]} - {proc.pid}
        assert len(job) >= 5 and all(pid_running(pid) for pid in job)  # 2 ranks, 2 wrappers, mpirun/horovodrun
        kill_launcher(proc, how)
        gone_after, left = wait_until_gone(job, BOUND)
        assert left == [], f"still running {BOUND} s after the launcher's death: {left}"
        code = proc.wait(timeout=BOUND)  # after SIGHUP: how the first rank ended (SIGTERM, or mpirun's SIGUSR1)
        assert code == -signal.SIGKILL if how != "sighup" else code > 128
    finally:
        end_job(job, proc)  # only if the test failed: end what it started, by pid
    record_figures(f"launcher death: {how} ({controller})", seconds_until_every_process_gone=round(gone_after, 2))
    folders = [path for r in records for path in r["folders"].values()]
    assert [p for p in folders if os.path.exists(p)] == []
    assert sorted(os.listdir(tmpdir)) == []
    if how == "sighup":
        assert "stopped by SIGHUP sent to the launcher" in (tmp_path / "launcher.log").read_text()
