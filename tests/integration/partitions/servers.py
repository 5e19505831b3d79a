"""Broker servers of the partition test's own, on the bridge's address.

Debian's binaries (redis-server, nats-server, PostgreSQL's initdb and
pg_ctl), each with its data in a directory of its own, started and stopped
by the test.  ``start(kind, address, dir)`` returns the URL the workers use
and a function that stops the server.
"""

from __future__ import annotations

import glob
import os
import secrets
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path
from urllib.parse import quote

from tests.conftest import require_service
from tests.integration.clusters.rabbitcluster import BOOT_TIMEOUT, RabbitNode
from tests.integration.clusters.rabbitcluster import SERVER as RABBIT
from tests.integration.nats.conftest import NATS_SERVER as NATS
from tests.integration.partitions.netns import wait_port
from tests.integration.serverproc import free_port


def _pg_bin() -> str | None:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"))
    return os.path.dirname(found[-1]) if found else None


def _popen(cmd: list[str], log: Path) -> Callable[[], None]:
    out = log.open("ab")
    proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)

    def stop() -> None:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=30)
        out.close()

    return stop


def redis(address: str, dir: Path) -> tuple[str, Callable[[], None]]:
    binary = shutil.which("redis-server")
    require_service("redis-server", binary is not None, "no redis-server binary on PATH")
    assert binary is not None
    port = free_port()
    stop = _popen(
        [binary, "--bind", address, "--port", str(port), "--save", "", "--appendonly", "no",
         "--protected-mode", "no", "--dir", str(dir)],
        dir / "redis.log",
    )  # fmt: skip
    wait_port(address, port, "redis-server")
    return f"redis://{address}:{port}/0?prefix=part", stop


def nats(address: str, dir: Path) -> tuple[str, Callable[[], None]]:
    require_service("nats-server", NATS is not None, "no nats-server binary")
    assert NATS is not None
    port = free_port()
    stop = _popen(
        [NATS, "-a", address, "-p", str(port), "-js", "-sd", str(dir / "js")], dir / "nats.log"
    )
    wait_port(address, port, "nats-server")
    return f"nats://{address}:{port}?prefix=part", stop


def postgres(address: str, dir: Path) -> tuple[str, Callable[[], None]]:
    """initdb and pg_ctl as the ``postgres`` user (PostgreSQL refuses root),
    in a directory of its own under /tmp (the test's tmp dir is root's
    alone)."""
    bin = _pg_bin()
    require_service("postgresql", bin is not None, "no /usr/lib/postgresql/*/bin/pg_ctl")
    assert bin is not None
    data = Path(tempfile.mkdtemp(prefix="dw-part-pg-"))
    shutil.chown(data, "postgres", "postgres")
    as_pg = ["runuser", "-u", "postgres", "--"]
    subprocess.run(
        [*as_pg, f"{bin}/initdb", "-D", str(data), "-A", "trust", "-U", "postgres"],
        check=True,
        capture_output=True,
    )
    with (data / "pg_hba.conf").open("a") as f:
        f.write("host all all 10.200.0.0/16 trust\n")
    port = free_port()
    opts = f"-c listen_addresses={address} -p {port} -k {data} -c fsync=off"
    subprocess.run(
        [*as_pg, f"{bin}/pg_ctl", "-D", str(data), "-o", opts, "-l", str(data / "log"), "-w",
         "start"],
        check=True,
        capture_output=True,
    )  # fmt: skip

    def stop() -> None:
        subprocess.run(
            [*as_pg, f"{bin}/pg_ctl", "-D", str(data), "-m", "immediate", "stop"],
            capture_output=True,
        )
        shutil.copy(data / "log", dir / "postgres.log")
        shutil.rmtree(data, ignore_errors=True)

    return f"postgresql://postgres@{address}:{port}/postgres?schema=part&migrate=auto", stop


class _Rabbit(RabbitNode):
    """One RabbitMQ node (``clusters/rabbitcluster.py``'s) listening on the
    bridge's address, where ``guest`` may log in from the hosts."""

    def __init__(self, dir: Path, address: str) -> None:
        home = dir / "home"
        home.mkdir(parents=True)
        cookie = home / ".erlang.cookie"
        cookie.write_text(secrets.token_hex(16).upper())
        cookie.chmod(0o400)
        env_file = dir / "rabbitmq-env.conf"
        env_file.write_text("")
        super().__init__(dir / "node", f"dwp{secrets.token_hex(3)}@localhost", home, env_file)
        self.address = address
        (self.dir / "rabbitmq.conf").write_text(
            f"listeners.tcp.default = {address}:{self.port}\nloopback_users = none\n"
        )

    def env(self) -> dict[str, str]:
        return {**super().env(), "RABBITMQ_NODE_IP_ADDRESS": self.address}


def rabbitmq(address: str, dir: Path) -> tuple[str, Callable[[], None]]:
    """A RabbitMQ node and, as its state store, a Redis (both on the bridge)."""
    require_service(
        "rabbitmq-server", RABBIT is not None, "no /usr/lib/rabbitmq/bin/rabbitmq-server"
    )
    state, stop_redis = redis(address, dir)
    node = _Rabbit(dir / "rabbitmq", address)
    node.start()
    try:
        wait_port(address, node.port, "rabbitmq-server", timeout=BOOT_TIMEOUT)
    except BaseException:
        node.kill()
        stop_redis()
        raise

    def stop() -> None:
        node.kill()
        stop_redis()

    store = quote(state, safe="")
    return f"amqp://guest:guest@{address}:{node.port}/%2F?prefix=part&state={store}", stop


SERVERS = {"redis": redis, "nats": nats, "postgres": postgres, "rabbitmq": rabbitmq}
