"""``hvdkit doctor``: check the installation (and hosts), run 2-rank allreduces; exit 1 when something is wrong."""

from __future__ import annotations

import argparse

__all__ = ["register", "main"]


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``hvdkit doctor`` to the sub-command parsers ``sub``."""
    d = sub.add_parser("doctor", help="check the installation and run a 2-rank allreduce")
    d.add_argument("--no-smoke", action="store_true", help="skip the 2-rank smoke test")
    d.add_argument(
        "-H", "--hosts", metavar="HOST:SLOTS,...", help="also check these hosts: ssh, versions, route, allreduce"
    )
    d.add_argument("--hostfile", metavar="FILE", help="also check the hosts of this hostfile")
    d.add_argument("--network-interface", metavar="IFACE", help="the interface the job will use across hosts")


def main(args: argparse.Namespace) -> int:
    """Run ``hvdkit doctor`` from parsed arguments: 0 when nothing is wrong, else 1."""
    from ..diagnostics.doctor import diagnose
    from ..launcher import hosts

    found = (
        hosts.parse_host_list(args.hosts) if args.hosts else hosts.read_hostfile(args.hostfile) if args.hostfile else ()
    )
    problems = diagnose(smoke=not args.no_smoke, hosts=found, network_interface=args.network_interface)
    return 1 if problems else 0
