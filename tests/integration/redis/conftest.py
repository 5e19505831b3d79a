"""Fixtures for the Redis broker's own tests.

``redis_server`` is a redis-server of the test's own, on a free loopback
port with its data in the test's tmp dir (AOF on, fsync at every write), so
a test may restart it, flush its script cache or kill it without touching
the shared server.  ``shared_url`` is a fresh prefix on the shared server
(db 15), like the conformance suite's.
"""

from __future__ import annotations

import random
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


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_cluster_port() -> int:
    """A free port whose cluster bus port (port + 10000) is free too."""
    for _ in range(200):
        port = random.randint(20000, 45000)
        if _bindable(port) and _bindable(port + 10000):
            return port
    raise RuntimeError("no free port pair for a cluster node")


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


class RedisCluster:
    """Three primaries on free loopback ports (no replicas), slots spread."""

    def __init__(self, dir: Path) -> None:
        options = (
            *("--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf"),
            *("--cluster-node-timeout", "2000", "--appendonly", "no"),
        )
        self.nodes = [RedisServer(dir / f"n{i}", free_cluster_port(), *options) for i in range(3)]

    def start(self) -> None:
        for node in self.nodes:
            node.dir.mkdir(parents=True)
            node.start()
        cli = shutil.which("redis-cli")
        assert cli is not None
        subprocess.run(
            [cli, "--cluster", "create", *(f"127.0.0.1:{n.port}" for n in self.nodes),
             "--cluster-yes"],
            check=True,
            capture_output=True,
            timeout=60,
        )  # fmt: skip
        # wait until every node agrees the cluster is up
        import redis

        deadline = time.monotonic() + 30
        for node in self.nodes:
            client = redis.Redis(port=node.port)
            try:
                while client.cluster("info")["cluster_state"] != "ok":
                    if time.monotonic() > deadline:
                        raise TimeoutError("cluster did not come up")
                    time.sleep(0.05)
            finally:
                client.close()

    def stop(self) -> None:
        for node in self.nodes:
            node.stop(signal.SIGKILL)


@pytest.fixture
def redis_cluster(tmp_path: Path) -> Iterator[RedisCluster]:
    ok = REDIS_SERVER is not None and shutil.which("redis-cli") is not None
    require_service("redis-server", ok, "no redis-server / redis-cli binary on PATH")
    for attempt in range(3):  # a port picked free may be taken before the node binds it
        cluster = RedisCluster(tmp_path / f"cluster{attempt}")
        try:
            cluster.start()
            break
        except (RuntimeError, TimeoutError, subprocess.SubprocessError):
            cluster.stop()
            if attempt == 2:
                raise
    try:
        yield cluster
    finally:
        cluster.stop()
