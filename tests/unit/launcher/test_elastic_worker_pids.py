"""A stop under `hvdkit run --recovery in-process` reaches Horovod's elastic workers on this host: found below
the driver as the worker's command itself, never the `/bin/sh -c` Horovod runs it with (a SIGTERM ends that
shell, not the worker), the middleman between, or what the worker started. A real process tree, built as
Horovod's driver builds it (safe_shell_exec: driver -> middleman -> /bin/sh -c COMMAND -> the command)."""

import os
import signal
import subprocess
import sys
import textwrap
import time

from hvdkit.launcher.rank_signals import elastic_worker_pids

WORKER = """
import os, subprocess, sys, time
subprocess.Popen(["sleep", "60"])  # what the worker starts itself
with open(sys.argv[1], "w") as f:
    f.write(str(os.getpid()))
time.sleep(60)
"""

DRIVER = """
import os, subprocess, sys, time
folder, python = sys.argv[1], sys.executable
middleman = "import os, subprocess, sys; env = dict(os.environ, HOROVOD_GLOO_RENDEZVOUS_PORT='1234'); "
middleman += "subprocess.Popen(sys.argv[1], shell=True, env=env).wait()"
commands = [
    f"{python} {folder}/worker.py {folder}/w0; true",  # the shell stays, waiting for the worker
    f"{python} {folder}/worker.py {folder}/w1",  # a simple command: the shell may exec it
]
children = [subprocess.Popen([python, "-c", middleman, c]) for c in commands]
children.append(subprocess.Popen(["sleep", "60"]))  # not a worker (as the ssh client of a remote one)
time.sleep(60)
"""


def test_the_workers_below_the_driver_are_their_commands_not_the_shells_middlemen_or_their_children(tmp_path):
    (tmp_path / "worker.py").write_text(textwrap.dedent(WORKER))
    driver = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(DRIVER), str(tmp_path)],
        start_new_session=True,
        env={k: v for k, v in os.environ.items() if k != "HOROVOD_GLOO_RENDEZVOUS_PORT"},
    )
    try:
        deadline = time.monotonic() + 60
        while not all((tmp_path / f"w{i}").exists() and (tmp_path / f"w{i}").read_text() for i in (0, 1)):
            assert time.monotonic() < deadline and driver.poll() is None, "the workers never started"
            time.sleep(0.05)
        workers = sorted(int((tmp_path / f"w{i}").read_text()) for i in (0, 1))
        assert sorted(elastic_worker_pids(driver.pid)) == workers
    finally:
        os.killpg(driver.pid, signal.SIGKILL)
        driver.wait()
