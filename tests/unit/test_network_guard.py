"""The tests' loopback guard (tests/conftest.py): a test that reaches past 127.0.0.0/8 fails."""
from __future__ import annotations

import socket

import pytest

from tests.conftest import OffLoopback


@pytest.mark.parametrize("address", [("192.0.2.1", 443), ("169.254.169.254", 80)])
def test_a_connection_off_loopback_is_refused(address):
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock, pytest.raises(OffLoopback):
        sock.connect(address)


def test_loopback_is_allowed():
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        with socket.socket() as client:
            client.connect(server.getsockname())
