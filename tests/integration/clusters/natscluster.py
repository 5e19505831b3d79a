"""Three nats-server processes routed into one JetStream cluster.

Each node has a client port, a route port (both free loopback ports) and
its JetStream store in the test's tmp dir; every node lists every route.
The app's URL names all three servers and asks for ``replicas=3``
(docs/nats.md, "Clusters"): nats-py moves to another server when its own
goes away, and every stream and the KV bucket keep a copy on each node.
"""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
from pathlib import Path

from dumbwaiter.brokers.nats.names import stream_names
from tests.integration.nats.conftest import NATS_SERVER, NatsServer
from tests.integration.serverproc import free_port
from tests.waiting import wait_until

#: the app's namespace: its streams are DW_dwc_WORK...
PREFIX = "dwc"
WORK_STREAM = f"DW_{PREFIX}_WORK"


class NatsNode(NatsServer):
    """One routed node: ``NatsServer`` with a server name and routes."""

    def __init__(self, dir: Path, port: int, index: int, cluster_port: int) -> None:
        super().__init__(dir, port)
        self.index = index
        self.cluster_port = cluster_port
        self.routes: list[int] = []

    @property
    def server_name(self) -> str:
        return f"n{self.index}"

    def command(self) -> list[str]:
        assert NATS_SERVER is not None
        routes = ",".join(f"nats://127.0.0.1:{p}" for p in self.routes)
        return [
            NATS_SERVER, "-a", "127.0.0.1", "-p", str(self.port), "-n", self.server_name,
            "-js", "-sd", str(self.dir / "js"), "-l", str(self.log),
            "--cluster_name", "dwc", "--cluster", f"nats://127.0.0.1:{self.cluster_port}",
            "--routes", routes,
        ]  # fmt: skip

    def start(self) -> None:
        self.proc = subprocess.Popen(self.command())


async def _request(port: int, subject: str) -> dict[str, object]:
    import nats

    nc = await nats.connect(f"nats://127.0.0.1:{port}", connect_timeout=3, allow_reconnect=False)
    try:
        reply = await nc.request(subject, b"", timeout=3)
        return json.loads(reply.data)  # type: ignore[no-any-return]
    finally:
        await nc.close()


class NatsCluster:
    name = "nats"

    def __init__(self, dir: Path) -> None:
        self.nodes = [NatsNode(dir / f"n{i}", free_port(), i, free_port()) for i in range(3)]
        for node in self.nodes:
            node.routes = [n.cluster_port for n in self.nodes]
            node.dir.mkdir(parents=True)

    def url(self, avoid: int | None = None) -> str:
        # every client gets every server: nats-py moves by itself
        servers = ",".join(f"127.0.0.1:{n.port}" for n in self.nodes)
        return f"nats://{servers}?prefix={PREFIX}&replicas=3"

    def start(self) -> None:
        for node in self.nodes:  # at once: a node waits for its peers' routes
            node.start()
        for node in self.nodes:
            node.wait_ready(30)
        self._until_jetstream(self.nodes)

    def _until_jetstream(self, nodes: list[NatsNode]) -> None:
        """Until JetStream answers on each node (its meta leader elected)."""

        def ok(node: NatsNode) -> bool:
            try:
                info = asyncio.run(_request(node.port, "$JS.API.INFO"))
            except Exception:
                return False
            return "error" not in info

        for node in nodes:
            wait_until(lambda n=node: ok(n), f"JetStream on {node.server_name}", 60)  # type: ignore[misc]

    def leader(self) -> int:
        """The node leading the job stream (``$JS.API.STREAM.INFO``)."""
        for node in self.nodes:
            if node.proc is None:
                continue
            try:
                info = asyncio.run(_request(node.port, f"$JS.API.STREAM.INFO.{WORK_STREAM}"))
            except Exception:
                continue
            cluster = info.get("cluster")
            if isinstance(cluster, dict) and cluster.get("leader"):
                return int(str(cluster["leader"])[1:])
        raise AssertionError(f"no node names a leader of {WORK_STREAM}")

    def replicas(self) -> dict[str, int]:
        """Each stream of the app (the KV bucket's too): its replica count."""
        node = next(n for n in self.nodes if n.proc is not None)
        out = {}
        for stream in stream_names(PREFIX):
            info = asyncio.run(_request(node.port, f"$JS.API.STREAM.INFO.{stream}"))
            config = info["config"]
            assert isinstance(config, dict), info
            out[stream] = int(config["num_replicas"])
        return out

    def kill(self, node: int) -> None:
        self.nodes[node].stop(signal.SIGKILL)

    def restart(self, node: int) -> None:
        self.nodes[node].start()
        self.nodes[node].wait_ready(30)
        self._until_jetstream([self.nodes[node]])

    def stop(self) -> None:
        for node in self.nodes:
            if node.proc is not None and node.proc.poll() is None:
                node.proc.kill()
            if node.proc is not None:
                node.proc.wait(timeout=30)
            node.proc = None
