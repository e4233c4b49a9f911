"""The port a test's server process is started on (``tests.helpers.free_port``)."""

from __future__ import annotations

import socket
from pathlib import Path

from tests.helpers import free_port


def test_a_server_s_port_is_free_and_none_an_outgoing_connection_is_handed() -> None:
    """Below the kernel's ephemeral range: an outgoing connection made before the server
    binds it cannot have taken it (a port ``bind(0)`` gave could be)."""
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    ports = {free_port() for _ in range(20)}
    assert all(10_000 <= p < low for p in ports), sorted(ports)
    assert len(ports) > 1  # chosen at random: two workers rarely pick the same
    for port in ports:
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))  # free as given
