"""Reading a daemon's pid file: sshd creates it and writes the number in two steps, so the file can
exist empty for a moment (CI read '' there and failed a multihost test with a ValueError)."""

import threading
import time

import pytest

from benchmarks.netns import wait_for_pidfile
from hvdkit.core.errors import LaunchError


@pytest.mark.parametrize("first", ["", "43"], ids=["empty", "part-of-the-number"])
def test_a_pid_file_is_read_only_once_its_line_is_complete(tmp_path, first):
    pidfile = tmp_path / "sshd.pid"
    pidfile.write_text(first)  # created, the number not (wholly) written yet
    writer = threading.Timer(0.3, lambda: pidfile.write_text("4321\n"))
    writer.start()
    try:
        assert wait_for_pidfile(pidfile, timeout=10, what="sshd") == 4321
    finally:
        writer.join()


def test_a_pid_file_never_written_is_an_error_naming_the_daemon_the_file_and_what_it_holds(tmp_path):
    pidfile = tmp_path / "sshd.pid"
    pidfile.write_text("")
    start = time.monotonic()
    with pytest.raises(
        LaunchError, match=r"sshd in ns1 did not write its pid to .*sshd\.pid within 0\.3 s \(it holds ''\)"
    ):
        wait_for_pidfile(pidfile, timeout=0.3, what="sshd in ns1")
    assert time.monotonic() - start < 5
