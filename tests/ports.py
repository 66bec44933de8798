"""A port for a server a test starts a moment later: chosen below the kernel's ephemeral range.

Asking the kernel for a free port (binding port 0) returns one from the ephemeral range, the range
it also takes every outgoing connection's local port from. Between the test choosing the port and
its server binding it, any connection on the machine can be given that number (a training rank's
rendezvous, a client polling that very port, another tier's requests), and the server's bind fails
with "Address already in use": CI on a fresh AMD machine failed so once (tests/workloads/
test_train_online.py: two ranks polled for 5 s before their stand-in server started). A port below
the range is never handed to a connection; it is taken only by something listening on it, which
the bind below finds, and then another is tried.
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

LOWEST = 10_000
"""Below this are the ports services on a developer's machine usually listen on."""


def ephemeral_range() -> tuple[int, int]:
    """The kernel's range for outgoing connections' local ports (Linux's default otherwise)."""
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999


def free_port() -> int:
    """A port on 127.0.0.1 nothing listens on now, outside the ephemeral range."""
    low, _ = ephemeral_range()
    chooser = random.SystemRandom()  # independent of tests that seed `random`
    for _ in range(200):
        port = chooser.randrange(LOWEST, max(low, LOWEST + 1000))
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port between {LOWEST} and {low}")
