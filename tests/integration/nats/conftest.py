"""Fixtures for the NATS broker's own tests.

``nats_server`` is a nats-server of the test's own (JetStream, file storage
in the test's tmp dir, a free loopback port), so a test may stop, kill and
restart it without touching the shared server.  ``shared_url`` is a fresh
namespace on the shared server, like the conformance suite's.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import require_service
from tests.integration.nats.server import new_namespace, url
from tests.integration.serverproc import ServerProcess, free_port

NATS_SERVER = shutil.which("nats-server") or (
    "/usr/sbin/nats-server" if os.path.exists("/usr/sbin/nats-server") else None
)


class NatsServer(ServerProcess):
    """One nats-server process on 127.0.0.1:``port`` with JetStream in ``dir``."""

    name = "nats"

    @property
    def server(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    def url(self, prefix: str = "t", **options: str) -> str:
        query = "&".join(f"{k}={v}" for k, v in {"prefix": prefix, **options}.items())
        return f"{self.server}?{query}"

    def command(self) -> list[str]:
        assert NATS_SERVER is not None
        return [
            NATS_SERVER, "-a", "127.0.0.1", "-p", str(self.port), "-js",
            "-sd", str(self.dir / "js"), "-l", str(self.log), *self.extra,
        ]  # fmt: skip

    def answers(self, s: socket.socket) -> bool:
        s.recv(4096)  # INFO
        s.sendall(b'CONNECT {"verbose":false}\r\nPING\r\n')
        return b"PONG" in s.recv(4096)


@pytest.fixture
def nats_server(tmp_path: Path) -> Iterator[NatsServer]:
    require_service("nats-server", NATS_SERVER is not None, "no nats-server binary found")
    server = NatsServer(tmp_path, free_port())
    server.start()
    try:
        yield server
    finally:
        server.stop(signal.SIGKILL)


@pytest.fixture
def shared_url() -> str:
    """A fresh namespace on the shared server (deleted with the next one)."""
    return url(new_namespace())
