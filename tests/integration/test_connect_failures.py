"""A broker that cannot serve a call: what a producer, a bare seam call and
the command line get, on every broker.

* Unreachable (a port nothing listens on; SQLite: a database whose write
  lock another connection holds): a producer call raises
  ``BrokerUnavailable`` naming the server at its deadline (the App's, 5 s by
  default, or the call's own), never after the broker's ``reconnect`` window:
  these URLs set that to 600 s, so a call that waited for it would outlive
  the test's timeout.  A call made outside any producer (a worker's) keeps
  the ``reconnect`` window, and gives up at its end.
* Refused for good (credentials the server rejects, a database or vhost
  that does not exist; SQLite: a file that is not a database): the first
  call raises ``BrokerAuthError`` / ``BrokerConfigError`` with the server's
  reason, at once, not after retrying for ``reconnect`` seconds.
* The CLI prints one line naming the server and the cause, and exits 1.

Kafka has no ``reconnect`` option: aiokafka's bootstrap gives up on a
refused port by itself.  Its refusal here is its state store's (a Redis
user that does not exist), named as that server; SASL credentials the
cluster refuses are not in ``REFUSED``: the tests' tansu takes none.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import parse_qs, quote, urlsplit

import pytest
from click.testing import CliRunner

import dumbwaiter as dw
from dumbwaiter.brokers import Broker, from_url
from dumbwaiter.cli import main
from dumbwaiter.task import SendOptions
from tests.conftest import require_service
from tests.integration.kafka import server as kafka_server
from tests.integration.nats.conftest import NATS_SERVER, NatsServer
from tests.integration.nats.server import _check as nats_check
from tests.integration.postgres.server import SERVER as PG_SERVER
from tests.integration.postgres.server import _check as pg_check
from tests.integration.rabbitmq.server import SERVER as AMQP_SERVER
from tests.integration.rabbitmq.server import amqp_base
from tests.integration.redis.server import SERVER as REDIS_SERVER
from tests.integration.redis.server import _check as redis_check
from tests.integration.redis.server import redis_url
from tests.integration.serverproc import free_port

BROKERS = ["sqlite", "postgres", "redis", "rabbitmq", "nats", "kafka"]
#: the ``reconnect`` (SQLite: ``busy_timeout``) of these URLs: longer than
#: any test may run, so only a deadline can end a call that waits
LONG = "600"


class Pinged(dw.Event, type="test.pinged"):
    n: int


def _hostport(server: str) -> str:
    parts = urlsplit(server)
    return f"{parts.hostname}:{parts.port}"


def _state(tmp_path: Path) -> str:
    """A RabbitMQ URL's ``state=``: a SQLite file of the test's own."""
    return quote(f"sqlite:///{tmp_path}/rabbitmq-state.db", safe="")


@contextlib.contextmanager
def unreachable(broker: str, tmp_path: Path, wait: str = LONG) -> Iterator[str]:
    """A URL of ``broker`` that cannot be served now, with ``wait`` seconds
    as its own retry window (``reconnect``; SQLite: ``busy_timeout``)."""
    port = free_port()  # nothing listens there: connections are refused
    if broker == "sqlite":
        path = tmp_path / "locked.db"
        url = f"sqlite:///{path}?busy_timeout={wait}"
        asyncio.run(_made(from_url(url)))
        holder = sqlite3.connect(path, isolation_level=None)
        holder.execute("BEGIN IMMEDIATE")  # another process's long write
        try:
            yield url
        finally:
            holder.execute("ROLLBACK")
            holder.close()
        return
    yield {
        "postgres": f"postgresql://postgres@127.0.0.1:{port}/test?reconnect={wait}",
        "redis": f"redis://127.0.0.1:{port}/0?reconnect={wait}",
        "rabbitmq": (
            f"amqp://guest:guest@127.0.0.1:{port}/?state={_state(tmp_path)}&reconnect={wait}"
        ),
        "nats": f"nats://127.0.0.1:{port}?reconnect={wait}",
        # no reconnect option; its state store (a Redis prefix) is reachable
        "kafka": f"kafka://127.0.0.1:{port}?state={quote(redis_url(tmp_path), safe='')}",
    }[broker]


async def _made(broker: Broker) -> None:
    """Make the broker's file and schema (then another process takes the lock)."""
    await broker.stats()
    await broker.close()


def _app_task(url: str, **app_options: object) -> tuple[dw.App, dw.Task]:
    app = dw.App(url, **app_options)  # type: ignore[arg-type]

    @app.task(name="test.ping")
    def ping(n: int) -> None: ...

    return app, ping


def _refuser(url: str) -> str:
    """The server a refusal of ``url`` names: Kafka's state store, else its own."""
    if url.startswith("kafka://"):
        return parse_qs(urlsplit(url).query)["state"][0]
    return url


def _assert_names_the_server(exc: BaseException, url: str) -> None:
    assert isinstance(exc, dw.BrokerError)
    parts = urlsplit(url)
    where = parts.path if parts.scheme == "sqlite" else f"{parts.hostname}:{parts.port}"
    assert where in str(exc), f"{exc} does not name {where}"
    assert exc.server is not None and where in exc.server
    if parts.password:
        assert f":{parts.password}@" not in str(exc), "the password is masked"


# -- unreachable: the producer's deadline ---------------------------------------


@pytest.mark.parametrize("broker", BROKERS)
def test_an_unreachable_broker_fails_a_sync_producer_at_the_default_deadline(
    broker: str, tmp_path: Path
) -> None:
    with unreachable(broker, tmp_path) as url:
        app, ping = _app_task(url)
        try:
            with pytest.raises(dw.BrokerUnavailable) as caught:
                ping.enqueue(1)
            _assert_names_the_server(caught.value, url)
        finally:
            app.close()


@pytest.mark.parametrize("broker", BROKERS)
def test_an_unreachable_broker_fails_an_async_producer_at_the_apps_deadline(
    broker: str, tmp_path: Path
) -> None:
    with unreachable(broker, tmp_path) as url:
        app, ping = _app_task(url, enqueue_timeout=1)

        async def go() -> None:
            try:
                with pytest.raises(dw.BrokerUnavailable) as caught:
                    await ping.aenqueue(1)
                _assert_names_the_server(caught.value, url)
                with pytest.raises(dw.BrokerUnavailable):
                    await app.apublish(Pinged(n=1))
            finally:
                await app.aclose()

        asyncio.run(go())


@pytest.mark.parametrize("broker", BROKERS)
def test_a_deadline_passed_per_call_is_honoured(broker: str, tmp_path: Path) -> None:
    """The App has no producer deadline here (its calls would wait the
    URL's 600 s): each call's own ends it."""
    with unreachable(broker, tmp_path) as url:
        app, ping = _app_task(url, enqueue_timeout=None)
        try:
            with pytest.raises(dw.BrokerUnavailable):
                ping.options(enqueue_timeout=0.5).enqueue(1)
            with pytest.raises(dw.BrokerUnavailable):
                ping.options(enqueue_timeout=0.5).enqueue_many([1, 2, 3])
            with pytest.raises(dw.BrokerUnavailable):
                app.publish(Pinged(n=1), enqueue_timeout=0.5)

            async def go() -> None:
                with pytest.raises(dw.BrokerUnavailable):
                    await ping.options(enqueue_timeout=0.5).aenqueue(1)

            asyncio.run(go())
        finally:
            app.close()


@pytest.mark.parametrize("broker", BROKERS)
def test_a_call_outside_any_producer_gives_up_after_the_reconnect_window(
    broker: str, tmp_path: Path
) -> None:
    """A worker's own calls are not bound by a producer's deadline: they keep
    the URL's ``reconnect`` window (1 s here; Kafka: aiokafka's bootstrap),
    and end with ``BrokerUnavailable`` too (NATS's first connect used to
    retry for ever)."""
    with unreachable(broker, tmp_path, wait="1") as url:
        app, ping = _app_task(url, enqueue_timeout=0.001)
        msg = ping.message((1,), {}, SendOptions())

        async def go() -> None:
            try:
                with pytest.raises(dw.BrokerUnavailable) as caught:
                    await app.broker.enqueue([msg])
                _assert_names_the_server(caught.value, url)
            finally:
                await app.broker.close()

        asyncio.run(go())


# -- refused for good: at once, with the reason ----------------------------------


class AuthNatsServer(NatsServer):
    """A nats-server of the test's own that wants a user and password."""

    def answers(self, s: socket.socket) -> bool:
        s.recv(4096)  # INFO
        s.sendall(b'CONNECT {"verbose":false,"user":"alice","pass":"s3cret"}\r\nPING\r\n')
        return b"PONG" in s.recv(4096)


@pytest.fixture
def nats_with_auth(tmp_path: Path) -> Iterator[AuthNatsServer]:
    require_service("nats-server", NATS_SERVER is not None, "no nats-server binary found")
    server = AuthNatsServer(tmp_path, free_port(), "--user", "alice", "--pass", "s3cret")
    server.start()
    try:
        yield server
    finally:
        server.stop()


#: (broker, what is wrong) -> (error class, text of the server's reason)
REFUSED: dict[tuple[str, str], tuple[type[dw.BrokerError], str]] = {
    ("sqlite", "not a database"): (dw.BrokerConfigError, "not a database"),
    ("postgres", "unknown role"): (dw.BrokerAuthError, 'role "nosuchrole" does not exist'),
    ("postgres", "unknown database"): (
        dw.BrokerConfigError,
        'database "nosuchdb" does not exist',
    ),
    ("redis", "unknown user"): (dw.BrokerAuthError, "invalid username-password pair"),
    ("redis", "unknown database"): (dw.BrokerConfigError, "DB index is out of range"),
    ("rabbitmq", "wrong password"): (dw.BrokerAuthError, "ACCESS_REFUSED"),
    ("rabbitmq", "unknown vhost"): (dw.BrokerConfigError, "'nosuchvhost'"),
    ("nats", "wrong password"): (dw.BrokerAuthError, "Authorization Violation"),
    ("kafka", "state store user"): (dw.BrokerAuthError, "invalid username-password pair"),
}


def _refused_url(broker: str, what: str, tmp_path: Path, request: pytest.FixtureRequest) -> str:
    if broker == "sqlite":
        path = tmp_path / "notes.db"
        path.write_text("shopping list: bread, milk, a database (this is not one)\n" * 20)
        return f"sqlite:///{path}"
    if broker == "postgres":
        ok, why = pg_check()
        require_service("PostgreSQL", ok, why)
        where = _hostport(PG_SERVER)
        if what == "unknown role":
            return f"postgresql://nosuchrole:wrong@{where}/test?reconnect={LONG}"
        return f"postgresql://postgres@{where}/nosuchdb?reconnect={LONG}"
    if broker == "redis":
        ok, why = redis_check()
        require_service("Redis", ok, why)
        where = _hostport(REDIS_SERVER)
        if what == "unknown user":
            return f"redis://nosuchuser:wrong@{where}/0?reconnect={LONG}"
        return f"redis://{where}/9999?reconnect={LONG}"
    if broker == "rabbitmq":
        amqp_base()  # skips (fails in CI) without the server
        where = _hostport(AMQP_SERVER)
        query = f"state={_state(tmp_path)}&reconnect={LONG}"
        if what == "wrong password":
            return f"amqp://guest:wrong@{where}/?{query}"
        return f"amqp://guest:guest@{where}/nosuchvhost?{query}"
    if broker == "kafka":
        state = f"redis://nosuchuser:wrong@{_hostport(REDIS_SERVER)}/0?reconnect={LONG}"
        return kafka_server.url(kafka_server.new_prefix(), state)
    ok, why = nats_check()
    require_service("NATS", ok, why)
    server: AuthNatsServer = request.getfixturevalue("nats_with_auth")
    return f"nats://alice:wrong@127.0.0.1:{server.port}?reconnect={LONG}"


@pytest.mark.parametrize(("broker", "what"), list(REFUSED), ids=[" ".join(k) for k in REFUSED])
def test_a_refused_url_fails_the_first_call_at_once_with_the_reason(
    broker: str, what: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """No retry: the URL's ``reconnect`` is 600 s and the App sets no
    deadline, so a call that retried would outlive the test."""
    url = _refused_url(broker, what, tmp_path, request)
    kind, reason = REFUSED[(broker, what)]
    app, ping = _app_task(url, enqueue_timeout=None)
    try:
        with pytest.raises(kind, match=reason) as caught:
            ping.enqueue(1)
        _assert_names_the_server(caught.value, _refuser(url))
        assert caught.value.__cause__ is not None, "the client's own error is kept"

        async def go() -> None:
            try:
                with pytest.raises(kind, match=reason):
                    await ping.aenqueue(1)
                with pytest.raises(kind, match=reason):  # the admin side: the same error
                    await app.broker.open()
                    await app.broker.stats()
            finally:
                await app.broker.close()

        asyncio.run(go())
    finally:
        app.close()


# -- the command line --------------------------------------------------------------


@pytest.mark.parametrize(("broker", "what"), list(REFUSED), ids=[" ".join(k) for k in REFUSED])
def test_the_cli_says_what_was_refused_in_one_line(
    broker: str, what: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    url = _refused_url(broker, what, tmp_path, request)
    _, reason = REFUSED[(broker, what)]
    result = CliRunner().invoke(main, ["stats", "--url", url])
    assert result.exit_code == 1, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1, result.output
    assert lines[0].startswith("Error: cannot connect to ") and reason in lines[0]
    password = urlsplit(_refuser(url)).password
    assert password is None or f":{password}@" not in result.output


@pytest.mark.parametrize("broker", BROKERS)
def test_the_cli_says_what_is_unreachable_in_one_line(broker: str, tmp_path: Path) -> None:
    with unreachable(broker, tmp_path) as url:
        result = CliRunner().invoke(main, ["stats", "--url", url])
    assert result.exit_code == 1, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1, result.output
    assert " is unavailable: " in lines[0]
