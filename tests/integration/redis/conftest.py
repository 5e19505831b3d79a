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
from tests.integration.serverproc import ServerProcess, free_port

REDIS_SERVER = shutil.which("redis-server")


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


class RedisServer(ServerProcess):
    """One redis-server process on 127.0.0.1:``port``, data in ``dir``."""

    name = "redis"

    def url(self, prefix: str = "t", **options: str) -> str:
        query = "&".join(f"{k}={v}" for k, v in {"prefix": prefix, **options}.items())
        return f"redis://127.0.0.1:{self.port}/0?{query}"

    def command(self) -> list[str]:
        assert REDIS_SERVER is not None
        return [
            REDIS_SERVER,
            "--port", str(self.port),
            "--bind", "127.0.0.1",
            "--dir", str(self.dir),
            "--appendonly", "yes",
            "--appendfsync", "always",
            "--save", "",
            "--logfile", str(self.log),
            *self.extra,
        ]  # fmt: skip

    def answers(self, s: socket.socket) -> bool:
        s.sendall(b"PING\r\n")
        return s.recv(64).startswith(b"+PONG")  # not -LOADING


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
