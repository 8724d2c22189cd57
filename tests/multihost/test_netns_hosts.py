"""Two sets of namespace hosts open at once (two test runs, or a test and `python -m benchmarks network`).

Needs root (namespaces, mounts).
"""

import os
import shutil
import subprocess

import pytest

from benchmarks.netns import TwoHosts

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces and mounts need root"),
    pytest.mark.skipif(
        not (shutil.which("ip") and os.path.exists("/usr/sbin/sshd")),
        reason="needs iproute2 and openssh-server (make setup installs them)",
    ),
]


def test_closing_one_set_of_hosts_keeps_ssh_working_on_another_set_still_open():
    # The hosts' ssh settings are mounted over ~/.ssh; closing one set used to remove ~/.ssh when
    # that set had created it, and every later command on the other set failed to mount.
    first, second = TwoHosts(prefix="hvdx"), TwoHosts(prefix="hvdy")
    try:
        first.open()
        second.open()
        first.close()
        b = second.names[1]
        proc = subprocess.run(
            second.argv_on(0, ["ssh", b, "hostname"]),
            capture_output=True,
            text=True,
            timeout=60,
            stdin=subprocess.DEVNULL,
        )
        assert (proc.returncode, proc.stdout.strip()) == (0, b), proc.stderr
    finally:
        first.close()
        second.close()
    assert first.leftovers() == [] and second.leftovers() == []
