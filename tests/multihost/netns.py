"""Two test hosts on this machine: network namespaces joined by a veth pair, sshd in each.

Everything lives in names and addresses this module creates (10.213.N.0/24 exists only inside
the two namespaces) and is removed by ``close()``, also after a failure. With ``private_tmp``
each host also gets its own empty /tmp (a tmpfs in its own mount namespace, gone with the host),
as separate machines have: nothing one host writes there is seen by the other or by the tests.
"""

import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
IN_HOST = HERE / "in_host.sh"
PRIVATE_TMP = HERE / "private_tmp.sh"  # a host's own /tmp; the checkout (ROOT) stays visible in it
ROOT = HERE.parents[1]
NIC = "hvd0"


def _sh(*argv):
    subprocess.run(argv, check=True, capture_output=True, text=True)


class TwoHosts:
    """Hosts ``a`` and ``b`` (names in ``self.names``); run commands on them with ``argv_on``."""

    def __init__(self, private_tmp=False):
        tag = os.getpid() % 10000
        subnet = 10 + os.getpid() % 240
        self.ns = (f"hvdk{tag}a", f"hvdk{tag}b")
        self.names = self.ns  # each namespace's hostname equals its name
        self.addresses = (f"10.213.{subnet}.1", f"10.213.{subnet}.2")
        self.private_tmp = private_tmp
        # sshd reads its keys per connection: keep them where a host's private /tmp does not hide them
        self.tmp = Path(tempfile.mkdtemp(prefix="hvdkit-hosts-", dir="/var/tmp" if private_tmp else None))
        self.ssh_dir = self.tmp / "ssh"
        self._made_ssh_home = False
        self._sshd_pids = []

    def open(self):
        for ns in self.ns:
            _sh("ip", "netns", "add", ns)
            etc = Path("/etc/netns") / ns
            etc.mkdir(parents=True, exist_ok=True)  # ip netns exec mounts these over /etc
            lines = ["127.0.0.1 localhost"] + [f"{a} {n}" for a, n in zip(self.addresses, self.names)]
            (etc / "hosts").write_text("\n".join(lines) + "\n")
        _sh("ip", "link", "add", NIC, "netns", self.ns[0], "type", "veth", "peer", "name", NIC, "netns", self.ns[1])
        for ns, address in zip(self.ns, self.addresses):
            _sh("ip", "-n", ns, "addr", "add", f"{address}/24", "dev", NIC)
            _sh("ip", "-n", ns, "link", "set", "lo", "up")
            _sh("ip", "-n", ns, "link", "set", NIC, "up")
        self._keys()
        for i, (ns, name, address) in enumerate(zip(self.ns, self.names, self.addresses)):
            self._sshd(i, ns, name, address)
        return self

    def _keys(self):
        self.ssh_dir.mkdir()
        _sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(self.ssh_dir / "id_ed25519"))
        _sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(self.tmp / "host_key"))
        shutil.copy(self.ssh_dir / "id_ed25519.pub", self.tmp / "authorized_keys")
        patterns = " ".join([*self.names, *self.addresses])
        (self.ssh_dir / "config").write_text(
            f"Host {patterns}\n  IdentityFile {self.ssh_dir / 'id_ed25519'}\n  StrictHostKeyChecking no\n"
            "  UserKnownHostsFile /dev/null\n  BatchMode yes\n  LogLevel ERROR\n"
        )
        home_ssh = Path.home() / ".ssh"
        if not home_ssh.exists():  # a mount point for the test's settings; removed again by close()
            home_ssh.mkdir(mode=0o700)
            self._made_ssh_home = True

    def _sshd(self, i, ns, name, address):
        Path("/run/sshd").mkdir(exist_ok=True)
        config = self.tmp / f"sshd_{i}"
        pidfile = self.tmp / f"sshd_{i}.pid"
        config.write_text(
            f"ListenAddress {address}\nHostKey {self.tmp / 'host_key'}\n"
            f"AuthorizedKeysFile {self.tmp / 'authorized_keys'}\nPermitRootLogin prohibit-password\n"
            f"StrictModes no\nUsePAM no\nPidFile {pidfile}\n"
        )
        if self.private_tmp:  # every session sshd starts shares its mount namespace, so its /tmp
            _sh("ip", "netns", "exec", ns, "unshare", "-m", "-u", str(PRIVATE_TMP), str(ROOT), "--",
                "sh", "-c", 'hostname "$0" && exec /usr/sbin/sshd -f "$1"', name, str(config))
        else:
            _sh("ip", "netns", "exec", ns, "unshare", "-u", "sh", "-c", 'hostname "$0" && exec /usr/sbin/sshd -f "$1"',
                name, str(config))
        deadline = time.monotonic() + 10
        while not pidfile.exists():
            if time.monotonic() > deadline:
                raise RuntimeError(f"sshd did not start in {ns}")
            time.sleep(0.05)
        self._sshd_pids.append(int(pidfile.read_text()))

    def argv_on(self, i, argv):
        """``argv`` run on host i (0 = a, 1 = b) with the test's ssh settings."""
        tmp = ["--private-tmp", str(ROOT)] if self.private_tmp else []
        return ["ip", "netns", "exec", self.ns[i], "unshare", "-m", "-u",
                str(IN_HOST), self.names[i], str(self.ssh_dir), *tmp, "--", *argv]

    def close(self):
        for pid in self._sshd_pids:
            try:
                os.kill(pid, 15)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + 10
        while any(Path(f"/proc/{pid}").exists() for pid in self._sshd_pids) and time.monotonic() < deadline:
            time.sleep(0.05)
        for ns in self.ns:
            pids = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True).stdout.split()
            for pid in pids:  # anything a failed test left inside the namespace
                try:
                    os.kill(int(pid), 9)
                except (ProcessLookupError, ValueError):
                    pass
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
            shutil.rmtree(Path("/etc/netns") / ns, ignore_errors=True)
        if self._made_ssh_home:
            try:
                (Path.home() / ".ssh").rmdir()
            except OSError:
                pass
        shutil.rmtree(self.tmp, ignore_errors=True)

    def leftovers(self):
        """What of this test setup still exists (empty after ``close()``)."""
        out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
        found = [ns for ns in self.ns if ns in out]
        found += [str(p) for p in (Path("/etc/netns") / ns for ns in self.ns) if p.exists()]
        found += [str(pid) for pid in self._sshd_pids if Path(f"/proc/{pid}").exists()]
        return found
