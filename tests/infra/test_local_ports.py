"""park local gives every Ray server its own port (a repeated port broke runtime envs)."""

from __future__ import annotations

import socket

from workloads.protocol import free_port


def test_free_ports_are_distinct_and_bindable():
    ports = [free_port() for _ in range(2000)]  # bind-and-close alone repeats ports at this count
    assert len(set(ports)) == len(ports)
    with socket.socket() as s:
        s.bind(("127.0.0.1", free_port()))
