"""Reaching other hosts over ssh before a job starts: is each host there, and is it the same?"""

from __future__ import annotations

import ipaddress
import json
import socket
import subprocess
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from ..core.errors import LaunchError
from .hosts import LOCAL_NAMES, Host

__all__ = ["is_this_machine", "remote_hosts", "unreachable", "check_reachable", "ssh", "remote_json"]

_SSH_OPTIONS = ("-o", "BatchMode=yes", "-o", "ConnectTimeout=5")


def is_this_machine(name: str) -> bool:
    """True when ``name`` is this machine: ``localhost``, its host name, a loopback address (127.x,
    ``::1``), or a name (its fully qualified one too) or address that resolves to an address some
    interface here holds (IPv4 or IPv6)."""
    if name in LOCAL_NAMES or name == socket.gethostname():
        return True
    try:
        found = socket.getaddrinfo(name, None, type=socket.SOCK_DGRAM)
    except (OSError, UnicodeError):
        return False
    return any(_is_own_address(family, sockaddr) for family, _, _, _, sockaddr in found)


def _is_own_address(family: int, sockaddr: tuple) -> bool:
    try:
        if ipaddress.ip_address(sockaddr[0].split("%", 1)[0]).is_loopback:
            return True
        with socket.socket(family, socket.SOCK_DGRAM) as s:
            s.bind((sockaddr[0], 0, *sockaddr[2:]))  # only an address of this machine can be bound
        return True
    except (OSError, ValueError):
        return False


def remote_hosts(hosts: Iterable[Host]) -> list[Host]:
    """The hosts that are not this machine (ranks there are started over ssh)."""
    return [h for h in hosts if not is_this_machine(h.name)]


def ssh(host: str, argv: Sequence[str], timeout: float = 30) -> tuple[int, str]:
    """Run ``argv`` on ``host`` over ssh (key-based, no prompts); returns (exit code, output)."""
    try:
        p = subprocess.run(
            ["ssh", *_SSH_OPTIONS, host, "--", *argv],
            capture_output=True,
            text=True,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
        )
    except FileNotFoundError:
        return 127, "ssh is not installed (Debian: apt-get install openssh-client)"
    except subprocess.TimeoutExpired:
        return 124, f"no answer within {timeout} s"
    return p.returncode, (p.stdout + p.stderr).strip()


def unreachable(hosts: Iterable[Host], timeout: float = 15) -> dict[str, str]:
    """``{name: why}`` for every host that ssh cannot reach (checked in parallel); ``{}`` when all answer."""
    remote = remote_hosts(hosts)
    if not remote:
        return {}
    with ThreadPoolExecutor(max_workers=min(16, len(remote))) as pool:
        results = list(pool.map(lambda h: (h.name, *ssh(h.name, ["true"], timeout)), remote))
    return {name: (out.splitlines() or [f"exit code {code}"])[-1] for name, code, out in results if code != 0}


def check_reachable(hosts: Iterable[Host], timeout: float = 15) -> None:
    """Raise LaunchError naming every host that ssh cannot reach (checked in parallel)."""
    failed = unreachable(hosts, timeout)
    if failed:
        detail = "; ".join(f"{name}: {why}" for name, why in failed.items())
        raise LaunchError(
            f"cannot reach {', '.join(failed)} over ssh ({detail}). Ranks on other hosts are "
            "started over ssh: check the host names, that sshd runs there and that `ssh HOST true` works "
            "without a password"
        )


def remote_json(host: str, argv: Sequence[str], timeout: float = 60) -> tuple[dict[str, Any] | None, str | None]:
    """``(dict, None)`` from a command on ``host`` that prints one JSON object, or ``(None, error)``."""
    code, out = ssh(host, argv, timeout)
    if code != 0:
        return None, out.splitlines()[-1] if out else f"exit code {code}"
    try:
        return json.loads(out.splitlines()[-1]), None
    except (ValueError, IndexError):
        return None, f"unexpected answer: {out[-200:]}"
