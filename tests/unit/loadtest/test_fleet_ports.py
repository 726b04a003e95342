"""Fleet ports: one launch never hands the same port to two processes."""

from __future__ import annotations

import socket

from kvgate_core.net import free_ports
from loadtest.fleet import HOST


def test_free_ports_are_distinct_and_bindable() -> None:
    ports = free_ports(64)
    assert len(set(ports)) == 64
    with socket.socket() as s:
        s.bind((HOST, ports[0]))  # released again once picked
