"""Loopback ports for the processes a demo, a benchmark or a test starts."""

from __future__ import annotations

import socket


def free_ports(n: int) -> list[int]:
    """``n`` distinct free loopback ports: the sockets are held open together, since the kernel may hand a
    just-released port out again before the process it was picked for has bound it."""
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [int(s.getsockname()[1]) for s in socks]
    finally:
        for s in socks:
            s.close()
