"""Two test hosts on this machine: network namespaces joined by a veth pair, sshd in each.

The namespaces, veth pair, ssh keys, sshds and their clean-up are ``benchmarks.netns.TwoHosts``
(the network benchmark runs its jobs across the same hosts). This adds what only tests need: with
``private_tmp`` each host also gets its own empty /tmp (a tmpfs in its own mount namespace, gone
with the host), as separate machines have: nothing one host writes there is seen by the other or by
the tests. Everything lives in names and addresses the hosts create and is removed by ``close()``,
also after a failure.
"""

import os
import shutil
from pathlib import Path

import pytest

from benchmarks.netns import NIC
from benchmarks.netns import TwoHosts as _Hosts

__all__ = ["NEEDS_HOSTS", "NIC", "TwoHosts", "open_hosts"]

HERE = Path(__file__).resolve().parent
IN_HOST = HERE / "in_host.sh"
PRIVATE_TMP = HERE / "private_tmp.sh"  # a host's own /tmp; the checkout (ROOT) stays visible in it
ROOT = HERE.parents[1]
# What a test module that makes hosts needs (its pytestmark): root, iproute2 and sshd
NEEDS_HOSTS = [
    pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces and mounts need root"),
    pytest.mark.skipif(
        not (shutil.which("ip") and os.path.exists("/usr/sbin/sshd")),
        reason="needs iproute2 and openssh-server (make setup installs them)",
    ),
]


class TwoHosts(_Hosts):
    """Hosts ``a`` and ``b`` (names in ``self.names``); run commands on them with ``argv_on``."""

    def __init__(self, private_tmp=False, prefix="hvdk"):
        # sshd reads its keys per connection: keep them where a host's private /tmp does not hide them
        super().__init__(prefix=prefix, keys_dir="/var/tmp" if private_tmp else None)
        self.private_tmp = private_tmp

    def sshd_argv(self, i, config):
        if not self.private_tmp:
            return super().sshd_argv(i, config)
        # every session sshd starts shares its mount namespace, so its /tmp
        return [
            "ip",
            "netns",
            "exec",
            self.ns[i],
            "unshare",
            "-m",
            "-u",
            str(PRIVATE_TMP),
            str(ROOT),
            "--",
            "sh",
            "-c",
            'hostname "$0" && exec /usr/sbin/sshd -f "$1"',
            self.names[i],
            str(config),
        ]

    def close(self):
        """As the base class, and without a private /tmp also the session folders Open MPI's daemons
        made in /tmp under these hosts' names (``ompi.<host>.<uid>``): a daemon killed with its host
        cannot remove its own, and each run's host names are new, so they would pile up."""
        super().close()
        if not self.private_tmp:
            for name in self.names:
                for path in Path("/tmp").glob(f"ompi.{name}.*"):
                    shutil.rmtree(path, ignore_errors=True)

    def leftovers(self):
        found = super().leftovers()
        if not self.private_tmp:
            for name in self.names:
                found += [str(p) for p in Path("/tmp").glob(f"ompi.{name}.*")]
        return found

    def argv_on(self, i, argv):
        """``argv`` run on host i (0 = a, 1 = b) with the test's ssh settings."""
        tmp = ["--private-tmp", str(ROOT)] if self.private_tmp else []
        return [
            "ip",
            "netns",
            "exec",
            self.ns[i],
            "unshare",
            "-m",
            "-u",
            str(IN_HOST),
            self.names[i],
            str(self.ssh_dir),
            *tmp,
            "--",
            *argv,
        ]


PYENV_LOCK = Path.home() / ".pyenv" / "shims" / ".pyenv-shim"


def clear_stale_pyenv_lock(lock=PYENV_LOCK, now=None):
    """Remove pyenv's rehash lock when it is older than pyenv's own 60 s wait: a stale one.

    Every ssh login into a test host runs root's shell start-up, which on a machine set up with pyenv
    runs `pyenv init` and so `pyenv rehash`. A login killed mid-rehash (a test takes a host away)
    leaves the lock behind, and every later login then waits 60 s for it: ssh to a test host "gives no
    answer within 15 s" and elastic tests fail for a reason outside hvdkit (seen once, 2026-11-26).
    """
    import time

    try:
        if (now or time.time()) - lock.stat().st_mtime > 60:
            lock.unlink()
            return True
    except FileNotFoundError:
        pass
    return False


def open_hosts(**options):
    """Yields open TwoHosts(**options) (a module fixture's body); closes them at the end and checks
    that nothing they made survives."""
    clear_stale_pyenv_lock()
    two = TwoHosts(**options)
    try:
        yield two.open()
    finally:
        two.close()
    assert two.leftovers() == []
