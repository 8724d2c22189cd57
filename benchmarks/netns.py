"""Two hosts on one machine: network namespaces joined by a veth pair, sshd in each, a shapeable link.

What ``python -m benchmarks network`` and the multi-host tests (``tests/multihost``) run jobs
across. Everything lives in names and addresses this module creates (the 10.213.N.0/24 subnet
exists only inside the two namespaces) and ``close()`` removes it, also after a failure.
``shape(rate)`` limits the link with a token-bucket filter (``tc qdisc ... tbf``) on both ends of
the veth pair: each direction carries at most ``rate`` bits/s, as a full-duplex Ethernet link of
that speed does. Needs root, iproute2 and openssh-server.

Framework-free: the standard library and hvdkit's errors only.
"""

import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from hvdkit.core.errors import ConfigError, LaunchError

__all__ = ["NIC", "TwoHosts", "parse_rate", "format_rate", "missing_tools", "wait_for_pidfile"]

NIC = "hvd0"
# Run ARGV as if on host NAME: its own hostname (UTS namespace) and the hosts' ssh client settings
# over ~/.ssh (a private mount namespace). Started by ``ip netns exec NS unshare -m -u``.
# ~/.ssh is made if missing: another user's hosts may have removed it (older code did) meanwhile.
IN_HOST = (
    'set -e; name=$1; ssh_dir=$2; shift 2; hostname "$name"; mkdir -p -m 700 "$HOME/.ssh"; '
    'mount --bind "$ssh_dir" "$HOME/.ssh"; exec "$@"'
)
_UNITS = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9}


def parse_rate(text):
    """``"1gbit"``, ``"10gbit"``, ``"500mbit"`` or ``"unlimited"`` -> bits/s (None for unlimited)."""
    t = str(text).strip().lower()
    if t in ("unlimited", "none", "0"):
        return None
    for suffix in ("bit", "bps", "b"):
        if t.endswith(suffix):
            t = t[: -len(suffix)]
            break
    unit = t[-1:] if t[-1:] in _UNITS and not t[-1:].isdigit() else ""
    try:
        value = float(t[: len(t) - len(unit)]) * _UNITS[unit]
    except ValueError:
        value = 0
    if value <= 0:
        raise ConfigError(f"link rate must be like 1gbit, 10gbit, 500mbit or unlimited (got {text!r})")
    return int(value)


def format_rate(bits):
    """10**9 -> ``"1gbit"``; None -> ``"unlimited"``."""
    if bits is None:
        return "unlimited"
    for unit, scale in (("g", 10**9), ("m", 10**6), ("k", 10**3)):
        if bits >= scale and bits % scale == 0:
            return f"{bits // scale}{unit}bit"
    return f"{bits}bit"


def missing_tools():
    """What the hosts need and this machine lacks (root, ``ip``, ``tc``, sshd): [] when ready."""
    missing = [] if os.geteuid() == 0 else ["root (network namespaces and mounts)"]
    missing += [t for t in ("ip", "tc", "ssh-keygen", "unshare") if not shutil.which(t)]
    return missing + ([] if os.path.exists("/usr/sbin/sshd") else ["/usr/sbin/sshd (openssh-server)"])


def _sh(*argv):
    proc = subprocess.run(argv, capture_output=True, text=True)
    if proc.returncode != 0:
        raise LaunchError(f"{' '.join(argv)} failed (exit {proc.returncode}): {proc.stderr.strip()}")
    return proc.stdout


def wait_for_pidfile(path, timeout, what):
    """The pid a daemon wrote to ``path``, once the file holds a whole line (it may exist empty first).

    A daemon creates its pid file and writes the number in two steps; reading in between gives ''.
    """
    deadline = time.monotonic() + timeout
    while True:
        try:
            text = Path(path).read_text()
        except FileNotFoundError:
            text = ""
        if text.endswith("\n") and text.strip().isdigit():
            return int(text)
        if time.monotonic() > deadline:
            raise LaunchError(f"{what} did not write its pid to {path} within {timeout} s (it holds {text!r})")
        time.sleep(0.05)


class TwoHosts:
    """Hosts ``a`` and ``b`` (names in ``self.names``); run commands on them with ``argv_on``.

    ``prefix`` starts every namespace name (the process id follows, so two users at once do not
    meet); ``keys_dir`` is where the ssh keys and sshd settings go (a temporary folder).
    """

    def __init__(self, prefix="hvdk", keys_dir=None):
        tag = os.getpid() % 10000
        subnet = 10 + os.getpid() % 240
        self.ns = (f"{prefix}{tag}a", f"{prefix}{tag}b")
        self.names = self.ns  # each namespace's hostname equals its name
        self.addresses = (f"10.213.{subnet}.1", f"10.213.{subnet}.2")
        self.tmp = Path(tempfile.mkdtemp(prefix="hvdkit-hosts-", dir=keys_dir))
        self.ssh_dir = self.tmp / "ssh"
        self.rate = None  # bits/s of the shaped link; None: unlimited
        self._sshd_pids = []

    def __enter__(self):
        try:
            return self.open()
        except BaseException:
            self.close()
            raise

    def __exit__(self, *exc):
        self.close()

    def open(self):
        for ns in self.ns:
            _sh("ip", "netns", "add", ns)
            etc = Path("/etc/netns") / ns
            etc.mkdir(parents=True, exist_ok=True)  # ip netns exec mounts these over /etc
            lines = ["127.0.0.1 localhost"] + [f"{a} {n}" for a, n in zip(self.addresses, self.names, strict=True)]
            (etc / "hosts").write_text("\n".join(lines) + "\n")
        _sh("ip", "link", "add", NIC, "netns", self.ns[0], "type", "veth", "peer", "name", NIC, "netns", self.ns[1])
        for ns, address in zip(self.ns, self.addresses, strict=True):
            _sh("ip", "-n", ns, "addr", "add", f"{address}/24", "dev", NIC)
            _sh("ip", "-n", ns, "link", "set", "lo", "up")
            _sh("ip", "-n", ns, "link", "set", NIC, "up")
        self._keys()
        for i, (ns, name, address) in enumerate(zip(self.ns, self.names, self.addresses, strict=True)):
            self._sshd(i, ns, name, address)
        return self

    def shape(self, rate):
        """Limit each direction of the link to ``rate`` bits/s (tbf on both ends); None: unlimited.

        The bucket holds 2 ms of traffic at the rate, and at least 256 KB: the veth hands the
        qdisc segments of up to 64 KB (GSO), and a bucket smaller than one segment drops it.
        """
        for ns in self.ns:
            subprocess.run(["ip", "netns", "exec", ns, "tc", "qdisc", "del", "dev", NIC, "root"], capture_output=True)
            if rate is not None:
                burst = max(256 << 10, rate // 8 // 500)
                _sh(
                    "ip",
                    "netns",
                    "exec",
                    ns,
                    "tc",
                    "qdisc",
                    "add",
                    "dev",
                    NIC,
                    "root",
                    "tbf",
                    "rate",
                    f"{rate}bit",
                    "burst",
                    str(burst),
                    "latency",
                    "50ms",
                )
        self.rate = rate
        return self

    def qdisc(self, i):
        """``tc qdisc show`` of the link on host i: what shapes it now."""
        return _sh("ip", "netns", "exec", self.ns[i], "tc", "qdisc", "show", "dev", NIC)

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
        # The mount point for the hosts' ssh settings. It stays (empty) after close(): removing it
        # while another user's hosts mount over it would break their ssh.
        (Path.home() / ".ssh").mkdir(mode=0o700, exist_ok=True)

    def sshd_argv(self, i, config):
        """The command that starts host i's sshd (daemonizing) in its namespace, with its hostname."""
        return [
            "ip",
            "netns",
            "exec",
            self.ns[i],
            "unshare",
            "-u",
            "sh",
            "-c",
            'hostname "$0" && exec /usr/sbin/sshd -f "$1"',
            self.names[i],
            str(config),
        ]

    def _sshd(self, i, ns, name, address):
        Path("/run/sshd").mkdir(exist_ok=True)
        config = self.tmp / f"sshd_{i}"
        pidfile = self.tmp / f"sshd_{i}.pid"
        config.write_text(
            f"ListenAddress {address}\nHostKey {self.tmp / 'host_key'}\n"
            f"AuthorizedKeysFile {self.tmp / 'authorized_keys'}\nPermitRootLogin prohibit-password\n"
            f"StrictModes no\nUsePAM no\nPidFile {pidfile}\n"
            # A login runs root's shell start-up, which on a pyenv machine runs `pyenv rehash`: a login killed
            # mid-rehash (a test takes its host away) leaves pyenv's lock, and every later login waited 60 s for it
            # (a host "gave no answer within 15 s"). One second, then the login goes on without the rehash.
            "SetEnv PYENV_REHASH_TIMEOUT=1\n"
        )
        _sh(*self.sshd_argv(i, config))
        self._sshd_pids.append(wait_for_pidfile(pidfile, timeout=10, what=f"sshd in {ns}"))

    def argv_on(self, i, argv):
        """``argv`` run on host i (0 = a, 1 = b) with the hosts' ssh settings (it may ssh to the other)."""
        return [
            "ip",
            "netns",
            "exec",
            self.ns[i],
            "unshare",
            "-m",
            "-u",
            "sh",
            "-c",
            IN_HOST,
            "in_host",
            self.names[i],
            str(self.ssh_dir),
            *argv,
        ]

    def close(self):
        """Stop the sshds and anything left in the namespaces, delete them; safe to call twice."""
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
            for pid in pids:  # anything a failed job left inside the namespace
                try:
                    os.kill(int(pid), 9)
                except (ProcessLookupError, ValueError):
                    pass
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)  # also deletes the veth and its qdisc
            shutil.rmtree(Path("/etc/netns") / ns, ignore_errors=True)
        shutil.rmtree(self.tmp, ignore_errors=True)

    def leftovers(self):
        """What of these hosts still exists (empty after ``close()``)."""
        out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
        found = [ns for ns in self.ns if ns in out.split()]
        found += [str(p) for p in (Path("/etc/netns") / ns for ns in self.ns) if p.exists()]
        found += [str(pid) for pid in self._sshd_pids if Path(f"/proc/{pid}").exists()]
        return found
