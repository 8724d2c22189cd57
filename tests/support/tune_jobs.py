"""What the `hvdkit tune` end-to-end tests share: a study interrupted by Ctrl-C, a trial's job gone."""

import os
import signal
import subprocess
import time

from helpers import ROOT


def interrupt_after_complete(argv, completed):
    """Run ``argv`` (an ``hvdkit tune`` line) and send it SIGINT once ``completed`` trials printed COMPLETE;
    ``(exit code, its whole output)``. Its process group is killed if it outlives the test."""
    proc = subprocess.Popen(
        argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    lines, complete = [], 0
    try:
        for line in proc.stdout:
            lines.append(line)
            complete += line.startswith("trial ") and " COMPLETE " in line
            if complete == completed:
                proc.send_signal(signal.SIGINT)
                break
        lines += proc.stdout.readlines()
        return proc.wait(timeout=120), "".join(lines)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def wait_group_gone(pgid, timeout=60):
    """Until no process of group ``pgid`` runs; fails after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.1)
    raise AssertionError(f"process group {pgid} still runs after {timeout} s")
