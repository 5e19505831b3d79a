"""A Redis Cluster of three primaries with a replica each: six
``redis-server --cluster-enabled yes`` processes on free loopback ports
(each with its cluster bus port free too), joined by ``redis-cli --cluster
create ... --cluster-replicas 1``.

Every key of an app shares one hash tag, so the app lives on one shard: the
node that leads its jobs is the primary that owns the slot of
``{dw:PREFIX}``.  The app's URL names one node (any: the broker follows
``MOVED``) and asks for ``wait_replicas=1`` (docs/redis.md, "Redis
Cluster"): an enqueue returns once the shard's replica has it, so the
replica that takes over after the primary's loss has every confirmed job.
"""

from __future__ import annotations

import shutil
import signal
import subprocess
from pathlib import Path

import redis
from redis.crc import key_slot

from tests.integration.redis.conftest import RedisServer, free_cluster_port
from tests.waiting import wait_until

PREFIX = "dwc"
#: seconds a primary may be unreachable before its replica takes over (the
#: server's default is 15; a test wants its failover sooner)
NODE_TIMEOUT_MS = 2000


def _client(port: int) -> redis.Redis:
    return redis.Redis(port=port, socket_timeout=3, socket_connect_timeout=3)


class RedisClusterNodes:
    name = "redis"

    def __init__(self, dir: Path) -> None:
        options = (
            *("--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf"),
            *("--cluster-node-timeout", str(NODE_TIMEOUT_MS)),
        )
        self.nodes = [RedisServer(dir / f"n{i}", free_cluster_port(), *options) for i in range(6)]
        self._next = 0

    def url(self, avoid: int | None = None) -> str:
        """Each call names the next node (primary or replica) but ``avoid``."""
        while True:
            i, self._next = self._next, (self._next + 1) % len(self.nodes)
            if i != avoid:
                return self.nodes[i].url(prefix=PREFIX, wait_replicas="1")

    def start(self) -> None:
        for node in self.nodes:
            node.dir.mkdir(parents=True)
            node.proc = subprocess.Popen(node.command())
        for node in self.nodes:
            node.wait_ready(30)
        cli = shutil.which("redis-cli")
        assert cli is not None
        subprocess.run(
            [cli, "--cluster", "create", *(f"127.0.0.1:{n.port}" for n in self.nodes),
             "--cluster-replicas", "1", "--cluster-yes"],
            check=True, capture_output=True, timeout=60,
        )  # fmt: skip
        self._until_healthy(self.nodes)

    def _until_healthy(self, nodes: list[RedisServer]) -> None:
        """Until each node says the cluster is ok and each replica among
        ``nodes`` has synced with its primary (``WAIT`` counts only those)."""

        def healthy(node: RedisServer) -> bool:
            client = _client(node.port)
            try:
                if client.cluster("info")["cluster_state"] != "ok":
                    return False
                info = client.info("replication")
                return info["role"] == "master" or info.get("master_link_status") == "up"
            except redis.RedisError:
                return False
            finally:
                client.close()

        for node in nodes:
            wait_until(lambda n=node: healthy(n), f"redis node {node.port} to be healthy", 60)  # type: ignore[misc]

    def leader(self) -> int:
        """The primary that owns the app's slot (``CLUSTER NODES``)."""
        slot = key_slot(f"{{dw:{PREFIX}}}".encode())
        for node in self.nodes:
            if node.proc is None:
                continue
            client = _client(node.port)
            try:
                assert int(client.execute_command("CLUSTER KEYSLOT", f"{{dw:{PREFIX}}}")) == slot  # type: ignore[no-untyped-call]
                table = client.execute_command("CLUSTER NODES")  # type: ignore[no-untyped-call]
            except redis.RedisError:
                continue
            finally:
                client.close()
            for address, node_info in table.items():  # redis-py parses the table
                flags = node_info["flags"].split(",")
                if "master" not in flags or "fail" in flags:
                    continue
                if any(int(lo) <= slot <= int(hi) for lo, hi in node_info["slots"]):
                    port = int(address.rsplit(":", 1)[1])
                    return next(i for i, n in enumerate(self.nodes) if n.port == port)
        raise AssertionError(f"no primary owns slot {slot}")

    def kill(self, node: int) -> None:
        self.nodes[node].stop(signal.SIGKILL)

    def restart(self, node: int) -> None:
        """The old primary comes back as a replica of the one that took over."""
        server = self.nodes[node]
        server.proc = subprocess.Popen(server.command())
        server.wait_ready(30)
        self._until_healthy(self.nodes)

    def stop(self) -> None:
        for node in self.nodes:
            if node.proc is not None:
                node.stop(signal.SIGKILL)
