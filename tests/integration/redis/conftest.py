"""Fixtures for the Redis broker's own tests.

``redis_server`` is a redis-server of the test's own, on a free loopback
port with its data in the test's tmp dir (AOF on, fsync at every write), so
a test may restart it, flush its script cache or kill it without touching
the shared server.  ``shared_url`` is a fresh prefix on the shared server
(db 15), like the conformance suite's.
"""

from __future__ import annotations

import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import require_service
from tests.integration.redis.server import new_prefix, url

REDIS_SERVER = shutil.which("redis-server")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class RedisServer:
    """One redis-server process on 127.0.0.1:``port``, data in ``dir``."""

    def __init__(self, dir: Path, port: int, *extra: str) -> None:
        self.dir = dir
        self.port = port
        self.extra = extra
        self.proc: subprocess.Popen[bytes] | None = None

    def url(self, prefix: str = "t", **options: str) -> str:
        query = "&".join(f"{k}={v}" for k, v in {"prefix": prefix, **options}.items())
        return f"redis://127.0.0.1:{self.port}/0?{query}"

    def start(self) -> None:
        assert REDIS_SERVER is not None
        self.proc = subprocess.Popen(
            [
                REDIS_SERVER,
                "--port", str(self.port),
                "--bind", "127.0.0.1",
                "--dir", str(self.dir),
                "--appendonly", "yes",
                "--appendfsync", "always",
                "--save", "",
                "--logfile", str(self.dir / "redis.log"),
                *self.extra,
            ],
        )  # fmt: skip
        self.wait_ready()

    def wait_ready(self, timeout: float = 20.0) -> None:
        """Until the server answers PING (not LOADING)."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1) as s:
                    s.sendall(b"PING\r\n")
                    if s.recv(64).startswith(b"+PONG"):
                        return
            except OSError:
                pass
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"redis-server exited: {(self.dir / 'redis.log').read_text()}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"redis-server on port {self.port} did not start")
            time.sleep(0.02)

    def stop(self, sig: signal.Signals = signal.SIGTERM) -> None:
        if self.proc is None:
            return
        self.proc.send_signal(sig)
        self.proc.wait(timeout=30)
        self.proc = None

    def client(self) -> socket.socket:
        return socket.create_connection(("127.0.0.1", self.port))


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    require_service("redis-server", REDIS_SERVER is not None, "no redis-server binary on PATH")
    server = RedisServer(tmp_path, free_port())
    server.start()
    try:
        yield server
    finally:
        server.stop(signal.SIGKILL)


@pytest.fixture
def shared_url() -> str:
    """A fresh prefix on the shared server (db 15)."""
    return url(new_prefix())
