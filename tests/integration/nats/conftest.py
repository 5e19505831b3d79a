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
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import require_service
from tests.integration.nats.server import new_namespace, url

NATS_SERVER = shutil.which("nats-server") or (
    "/usr/sbin/nats-server" if os.path.exists("/usr/sbin/nats-server") else None
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class NatsServer:
    """One nats-server process on 127.0.0.1:``port`` with JetStream in ``dir``."""

    def __init__(self, dir: Path, port: int, *extra: str) -> None:
        self.dir = dir
        self.port = port
        self.extra = extra
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def server(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    def url(self, prefix: str = "t", **options: str) -> str:
        query = "&".join(f"{k}={v}" for k, v in {"prefix": prefix, **options}.items())
        return f"{self.server}?{query}"

    def start(self) -> None:
        assert NATS_SERVER is not None
        self.proc = subprocess.Popen(
            [
                NATS_SERVER, "-a", "127.0.0.1", "-p", str(self.port), "-js",
                "-sd", str(self.dir / "js"), "-l", str(self.dir / "nats.log"), *self.extra,
            ],
        )  # fmt: skip
        self.wait_ready()

    def wait_ready(self, timeout: float = 20.0) -> None:
        """Until the server answers PING with PONG."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1) as s:
                    s.recv(4096)  # INFO
                    s.sendall(b'CONNECT {"verbose":false}\r\nPING\r\n')
                    if b"PONG" in s.recv(4096):
                        return
            except OSError:
                pass
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"nats-server exited: {(self.dir / 'nats.log').read_text()}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"nats-server on port {self.port} did not start")
            time.sleep(0.02)

    def stop(self, sig: signal.Signals = signal.SIGTERM) -> None:
        if self.proc is None:
            return
        self.proc.send_signal(sig)
        self.proc.wait(timeout=30)
        self.proc = None


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
