"""Fixed ports for tests whose services must bind a port chosen in advance (Ray actors restart on theirs).

Asking the kernel for a free port (bind to 0) and binding it again later races with every outgoing
connection opened meanwhile: the kernel hands out source ports from the same ephemeral range. With a
Ray cluster up there are many such connections, and CI once lost a draft actor to "Failed to bind to
address 127.0.0.1:50261". So ports come from below the ephemeral range and above Ray's worker ports
(10002-19999), where nothing is handed out behind our back, and each is checked free before use.
"""

from __future__ import annotations

import os
import random
import socket

RAY_MAX_WORKER_PORT = 19999
_handed_out: set[int] = set()
_rng = random.Random(os.getpid())


def _ephemeral_low() -> int:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _this_workers_share(low: int, high: int) -> tuple[int, int]:
    """Under pytest-xdist (make test runs two workers) each worker picks from its own slice of
    [low, high]: two processes checking the same port free at once would both take it."""
    worker, count = os.environ.get("PYTEST_XDIST_WORKER", ""), int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if not worker.startswith("gw") or count <= 1:
        return low, high
    size = (high - low + 1) // count
    first = low + int(worker[2:]) % count * size  # a restarted worker gets the next number
    return first, first + size - 1


def fixed_port() -> int:
    """A port that is free now and that the kernel will not give to an outgoing connection."""
    low, high = RAY_MAX_WORKER_PORT + 1, _ephemeral_low() - 1
    if high <= low:  # an unusual port range: fall back to whatever the kernel offers
        low, high = 20000, 32767
    low, high = _this_workers_share(low, high)
    for _ in range(200):
        port = _rng.randint(low, high)
        if port not in _handed_out and bindable(port):
            _handed_out.add(port)
            return port
    raise RuntimeError(f"no free port in [{low}, {high}] after 200 tries")
