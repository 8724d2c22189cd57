"""A raw TCP stream, iperf-style: what one connection carries over the link, the reference for allreduces.

    python -m benchmarks.tcp_stream recv ADDRESS PORT      # prints READY, then one JSON line
    python -m benchmarks.tcp_stream send ADDRESS PORT [--seconds S]

The sender writes 1 MiB blocks for ``--seconds``; the receiver counts the bytes from the first one
to the end of the stream and prints ``{"bytes": N, "seconds": T, "bits_per_s": R}``. Standard
library only; the network section starts the two ends on two hosts (``benchmarks.network``).
"""

import argparse
import json
import socket
import sys
import time

__all__ = ["receive", "send", "main"]

BLOCK = 1 << 20


def receive(address, port, ready=None, timeout=60):
    """Accept one connection, read it to the end; {bytes, seconds, bits_per_s}."""
    with socket.create_server((address, port)) as server:
        server.settimeout(timeout)
        if ready:
            ready()
        conn, _ = server.accept()
        with conn:
            conn.settimeout(timeout)
            buf = bytearray(BLOCK)
            n = conn.recv_into(buf)
            t0, total = time.perf_counter(), 0  # from the first byte: the connection set-up is not the link
            while True:
                n = conn.recv_into(buf)
                if not n:
                    break
                total += n
            seconds = time.perf_counter() - t0
    return {"bytes": total, "seconds": seconds, "bits_per_s": 8 * total / seconds if seconds > 0 else 0.0}


def send(address, port, seconds, connect_timeout=10):
    """Write 1 MiB blocks to ``address:port`` for ``seconds``; the bytes sent."""
    deadline = time.monotonic() + connect_timeout
    while True:
        try:
            conn = socket.create_connection((address, port), timeout=connect_timeout)
            break
        except ConnectionRefusedError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)
    block, sent = bytes(BLOCK), 0
    with conn:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            conn.sendall(block)
            sent += BLOCK
    return sent


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("role", choices=("recv", "send"))
    p.add_argument("address")
    p.add_argument("port", type=int)
    p.add_argument("--seconds", type=float, default=2.0, help="how long the sender sends (default 2)")
    args = p.parse_args(argv)
    if args.role == "recv":
        result = receive(args.address, args.port, ready=lambda: print("READY", flush=True))
        print(json.dumps(result), flush=True)
    else:
        send(args.address, args.port, args.seconds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
