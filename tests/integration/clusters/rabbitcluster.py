"""Three RabbitMQ nodes of the test's own, clustered, beside the machine's
own node (which they leave alone).

Each node has its own name (``dwc<run><i>@localhost``: unique per test run,
so concurrent runs share the machine's epmd without clashing), AMQP and
distribution ports (free loopback ports), data, log and config files in
the test's tmp dir, and no plugins; all three share an Erlang cookie in a
HOME of their own, and read an empty ``rabbitmq-env.conf`` instead of the
machine's.  They boot at once (one scheduler each: the machine has two
cores), then nodes 2 and 3 join node 1 (``rabbitmqctl stop_app /
join_cluster / start_app``).

The app's queues are quorum queues (``queue_type``'s default, docs/
rabbitmq.md "Clusters"): a Raft group over the three nodes, whose leader
the test kills.  A URL names one node, so each client is pointed at a node
that does not lead the queue; its state store is a SQLite file in the
test's tmp dir (the workers run on this machine).
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
from pathlib import Path
from urllib.parse import quote

from dumbwaiter.brokers.rabbitmq.topology import Topology
from tests.integration.serverproc import free_port
from tests.waiting import wait_until

BIN = Path("/usr/lib/rabbitmq/bin")
#: the server and CLI scripts themselves (Debian's /usr/sbin ones switch to
#: the rabbitmq user, who cannot read the test's tmp dir)
SERVER = shutil.which("rabbitmq-server", path=str(BIN))
CTL = shutil.which("rabbitmqctl", path=str(BIN))
PREFIX = "dwc"
#: the queue the scenario's jobs go to: its main lane
QUEUE = Topology(PREFIX, "dw.delay").lane("default")
#: seconds a node may take to boot (three at once on two cores)
BOOT_TIMEOUT = 120.0


def _port_open(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


class RabbitNode:
    def __init__(self, dir: Path, name: str, home: Path, env_file: Path) -> None:
        self.dir = dir
        self.name = name
        self.port = free_port()
        self.dist_port = free_port()
        self.home = home
        self.env_file = env_file
        self.proc: subprocess.Popen[bytes] | None = None
        dir.mkdir(parents=True)
        (dir / "rabbitmq.conf").write_text(f"listeners.tcp.default = 127.0.0.1:{self.port}\n")
        (dir / "enabled_plugins").write_text("[].\n")

    def env(self) -> dict[str, str]:
        return {
            **os.environ,
            "HOME": str(self.home),
            "RABBITMQ_CONF_ENV_FILE": str(self.env_file),
            "RABBITMQ_NODENAME": self.name,
            "RABBITMQ_NODE_IP_ADDRESS": "127.0.0.1",
            "RABBITMQ_NODE_PORT": str(self.port),
            "RABBITMQ_DIST_PORT": str(self.dist_port),
            "RABBITMQ_MNESIA_BASE": str(self.dir / "mnesia"),
            "RABBITMQ_LOG_BASE": str(self.dir / "log"),
            "RABBITMQ_CONFIG_FILE": str(self.dir / "rabbitmq.conf"),
            "RABBITMQ_ENABLED_PLUGINS_FILE": str(self.dir / "enabled_plugins"),
            "RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS": (
                "+S 1:1 +A 4 -kernel inet_dist_use_interface {127,0,0,1}"
            ),
            "ERL_EPMD_ADDRESS": "127.0.0.1",
        }

    def start(self) -> None:
        assert SERVER is not None
        out = (self.dir / "stdout.log").open("ab")
        try:
            # a session of its own: the script runs the Erlang VM as its
            # child, and a kill must reach both (``kill``)
            self.proc = subprocess.Popen(
                [SERVER], env=self.env(), stdout=out, stderr=subprocess.STDOUT,
                start_new_session=True,
            )  # fmt: skip
        finally:
            out.close()

    def wait_ready(self, timeout: float = BOOT_TIMEOUT) -> None:
        """Until the AMQP listener answers (the last step of a boot)."""

        def up() -> bool:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited: {self.boot_log()}")
            return _port_open(self.port)

        wait_until(up, f"RabbitMQ node {self.name} to boot", timeout)

    def boot_log(self) -> str:
        path = self.dir / "stdout.log"
        return path.read_text(errors="replace")[-3000:] if path.exists() else ""

    def kill(self) -> None:
        """SIGKILL the VM and its script (their process group), and wait
        until every process of the group is gone (a dying VM may still
        accept connections for a moment)."""
        if self.proc is None:
            return
        pgid = self.proc.pid

        def gone(sig: int = 0) -> bool:
            try:
                os.killpg(pgid, sig)
            except ProcessLookupError:
                return True
            return False

        gone(signal.SIGKILL)
        self.proc.wait(timeout=30)
        self.proc = None
        wait_until(gone, f"the processes of {self.name} to end", 30)

    def ctl(self, *args: str, timeout: float = 60) -> str:
        assert CTL is not None
        env = {k: v for k, v in self.env().items() if k != "RABBITMQ_NODE_PORT"}
        r = subprocess.run(
            [CTL, "-q", "-n", self.name, *args],
            env=env, capture_output=True, timeout=timeout, check=False,
        )  # fmt: skip
        if r.returncode != 0:
            raise RuntimeError(f"rabbitmqctl {' '.join(args)} on {self.name}: {r.stderr.decode()}")
        return r.stdout.decode()


class RabbitCluster:
    name = "rabbitmq"

    def __init__(self, dir: Path) -> None:
        dir.mkdir(parents=True)
        home = dir / "home"
        home.mkdir()
        cookie = home / ".erlang.cookie"
        cookie.write_text(secrets.token_hex(16).upper())
        cookie.chmod(0o400)
        env_file = dir / "rabbitmq-env.conf"
        env_file.write_text("")
        run = secrets.token_hex(3)
        self.nodes = [
            RabbitNode(dir / f"n{i}", f"dwc{run}{i}@localhost", home, env_file) for i in range(3)
        ]
        self.state = f"sqlite:///{dir}/state.db"
        self._next = 0

    def url(self, avoid: int | None = None) -> str:
        """Each call names the next node but ``avoid``."""
        while True:
            i, self._next = self._next, (self._next + 1) % len(self.nodes)
            if i != avoid:
                node = self.nodes[i]
                state = quote(self.state, safe="")
                return f"amqp://guest:guest@127.0.0.1:{node.port}/%2F?prefix={PREFIX}&state={state}"

    def start(self) -> None:
        for node in self.nodes:  # at once: each boot is mostly the VM's own
            node.start()
        for node in self.nodes:
            node.wait_ready()
        first = self.nodes[0]
        for node in self.nodes[1:]:  # one at a time: each CLI call boots a VM
            node.ctl("stop_app")
            node.ctl("join_cluster", first.name)
            node.ctl("start_app")

    def leader(self) -> int:
        """The node leading the app's queue (``list_queues name leader``)."""
        for node in self.nodes:
            if node.proc is None:
                continue
            try:
                rows = json.loads(node.ctl("list_queues", "name", "leader", "--formatter", "json"))
            except (RuntimeError, ValueError, subprocess.TimeoutExpired):
                continue
            for row in rows:
                if row["name"] == QUEUE:
                    return next(i for i, n in enumerate(self.nodes) if n.name == row["leader"])
        raise AssertionError(f"no node names a leader of {QUEUE}")

    def members(self) -> dict[str, tuple[str, int]]:
        """Each queue of the app: its type and how many nodes hold it."""
        node = next(n for n in self.nodes if n.proc is not None)
        rows = json.loads(node.ctl("list_queues", "name", "type", "members", "--formatter", "json"))
        return {
            r["name"]: (r["type"], len(r["members"] or []))
            for r in rows
            if r["name"].startswith(PREFIX + ".")
        }

    def kill(self, node: int) -> None:
        self.nodes[node].kill()

    def restart(self, node: int) -> None:
        """The node boots on its data and rejoins the cluster by itself."""
        self.nodes[node].start()
        self.nodes[node].wait_ready()

    def stop(self) -> None:
        for node in self.nodes:
            node.kill()
