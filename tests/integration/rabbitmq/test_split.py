"""One state store per RabbitMQ app: a process that brings another refuses.

Issue 20: two hosts (two working directories) each ran ``dumbwaiter worker``
against one ``amqp://`` URL without ``state=``; each kept the job state in
its own ``dumbwaiter-state.db``, so every cron tick and every unique job ran
twice, and nothing warned.  Now the vhost announces the app's state store
(``brokers/rabbitmq/announce.py``) and the second store is refused with an
error naming both; the default store is one file per machine, whatever the
working directory.

"Hosts" here are processes with their own working directory and their own
``$XDG_STATE_HOME`` (where the default store lives): on one machine, two
state directories are what two machines are to the default.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from urllib.parse import quote, urlsplit, urlunsplit

import aiormq
import pytest
from click.testing import CliRunner

from dumbwaiter.brokers import from_url
from dumbwaiter.brokers.rabbitmq import announce
from dumbwaiter.brokers.rabbitmq.broker import RabbitMQBroker
from dumbwaiter.cli import main
from dumbwaiter.errors import BrokerError, StateStoreConflict
from dumbwaiter.message import Message, uuid7
from tests.conftest import require_service
from tests.integration.postgres.server import postgres_url
from tests.integration.rabbitmq import server
from tests.integration.redis.server import redis_url
from tests.waiting import wait_until

ROOT = Path(__file__).resolve().parents[3]
APP = "tests.apps.splitapp:app"


def _url(prefix: str, state: str | None = None) -> str:
    query = f"prefix={prefix}" + ("" if state is None else f"&state={quote(state, safe='')}")
    return f"{server.amqp_base()}?{query}"


async def _drop(prefix: str) -> None:
    """Delete what a test's prefix made: its announcement and its lane (quorum
    queues hold the shared server's file handles)."""
    conn = await aiormq.connect(server.amqp_base())
    try:
        ch = await conn.channel()
        for q in (announce.name(prefix), f"{prefix}.q.default"):
            await ch.queue_delete(q)
        await ch.exchange_delete(announce.name(prefix))
    finally:
        await conn.close()


@pytest.fixture
def prefix() -> Iterator[str]:
    p = server.new_prefix()
    yield p
    with contextlib.suppress(Exception):
        asyncio.run(_drop(p))


class Host:
    """A "machine": a working directory and a state directory of its own."""

    def __init__(self, root: Path, name: str, state_home: Path | None = None) -> None:
        self.cwd = root / name / "work"
        self.state_home = state_home or root / name / "state"
        self.cwd.mkdir(parents=True)
        self.state_home.mkdir(parents=True, exist_ok=True)
        self.log = root / name / "stderr.log"
        self.procs: list[subprocess.Popen[bytes]] = []

    def env(self, url: str) -> dict[str, str]:
        env = {
            **os.environ,
            "DUMBWAITER_URL": url,
            "XDG_STATE_HOME": str(self.state_home),
            "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)]),
        }
        env.pop("DUMBWAITER_APP", None)
        return env

    def worker(self, url: str) -> subprocess.Popen[bytes]:
        cmd = [sys.executable, "-m", "dumbwaiter", "worker", "--app", APP]
        with self.log.open("ab") as err:
            p = subprocess.Popen(cmd, cwd=self.cwd, env=self.env(url), stderr=err)
        self.procs.append(p)
        return p

    def default_store(self, url: str, monkeypatch: pytest.MonkeyPatch) -> str:
        """The state URL this host's processes use by default."""
        monkeypatch.setenv("XDG_STATE_HOME", str(self.state_home))
        return RabbitMQBroker(url).state_url or ""

    def stderr(self) -> str:
        return self.log.read_text(errors="replace")


@pytest.fixture
def hosts(tmp_path: Path) -> Iterator[list[Host]]:
    made: list[Host] = []
    yield made
    for h in made:
        for p in h.procs:
            if p.poll() is None:
                p.kill()
                p.wait(timeout=30)


def _workers(state_url: str) -> dict[str, bytes]:
    """The workers announced in a state store, read from the store itself
    (none while its file does not exist yet)."""
    if not os.path.exists(_file(state_url)):
        return {}

    async def go() -> dict[str, bytes]:
        store = from_url(state_url)
        try:
            return await store.kv_scan("worker:")
        finally:
            await store.close()

    return asyncio.run(go())


def _stop(p: subprocess.Popen[bytes]) -> None:
    p.send_signal(signal.SIGTERM)
    assert p.wait(timeout=60) == 0


def _file(state_url: str) -> str:
    return state_url.removeprefix("sqlite:///")


def test_a_second_host_on_the_default_state_store_refuses_naming_both(
    tmp_path: Path, prefix: str, hosts: list[Host], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The issue's setup: two hosts, one amqp:// URL, no state=.  The first
    runs; the second stops at once with an error that names both stores and
    the fix, instead of running a second truth beside the first."""
    url = _url(prefix)
    a, b = Host(tmp_path, "a"), Host(tmp_path, "b")
    hosts += [a, b]
    store_a, store_b = a.default_store(url, monkeypatch), b.default_store(url, monkeypatch)
    assert store_a != store_b
    first = a.worker(url)
    wait_until(lambda: len(_workers(store_a)) == 1, "the first host's worker to start")
    second = b.worker(url)
    assert second.wait(timeout=90) == 1
    err = b.stderr()
    assert _file(store_a) in err and _file(store_b) in err, err
    assert "reset-identity" in err and "refuses to start" in err
    assert "guest:guest" not in err and "guest:***" in err  # the broker's password is masked
    assert _workers(store_b) == {}  # it recorded nothing in its own store
    assert first.poll() is None  # and the first one runs on
    _stop(first)


def test_two_working_directories_of_one_machine_share_the_default_state_store(
    tmp_path: Path, prefix: str, hosts: list[Host], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two services of one machine in different working directories: the
    default state store is one file, so both run, in one truth."""
    url = _url(prefix)
    shared = tmp_path / "state"
    a, b = Host(tmp_path, "a", shared), Host(tmp_path, "b", shared)
    hosts += [a, b]
    store = a.default_store(url, monkeypatch)
    assert store == b.default_store(url, monkeypatch)
    workers = [a.worker(url), b.worker(url)]
    wait_until(lambda: len(_workers(store)) == 2, "both workers to announce themselves")
    assert all(p.poll() is None for p in workers)
    for p in workers:
        _stop(p)


def test_processes_starting_at_once_with_different_stores_exactly_one_runs(
    tmp_path: Path, prefix: str, hosts: list[Host], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first-start race: two hosts start together.  RabbitMQ decides
    (one exchange declare wins): one runs, the other refuses."""
    url = _url(prefix)
    a, b = Host(tmp_path, "a"), Host(tmp_path, "b")
    hosts += [a, b]
    stores = {a: a.default_store(url, monkeypatch), b: b.default_store(url, monkeypatch)}
    procs = {a: a.worker(url), b: b.worker(url)}
    wait_until(
        lambda: (
            any(p.poll() is not None for p in procs.values())
            and sum(len(_workers(s)) for s in stores.values()) == 1
        ),
        "one worker to refuse and the other to start",
        timeout=90,
    )
    [(loser, lost)] = [(h, p) for h, p in procs.items() if p.poll() is not None]
    [(winner, won)] = [(h, p) for h, p in procs.items() if p.poll() is None]
    assert lost.returncode == 1 and "refuses to start" in loser.stderr()
    assert _file(stores[winner]) in loser.stderr()
    assert len(_workers(stores[winner])) == 1 and _workers(stores[loser]) == {}
    _stop(won)


@contextlib.asynccontextmanager
async def _brokers(*urls: str) -> AsyncIterator[list[RabbitMQBroker]]:
    made = [RabbitMQBroker(u) for u in urls]
    try:
        yield made
    finally:
        for b in made:
            await b.close()


def _job() -> Message:
    return Message(id=uuid7(), kind="task", name="t", queue="default")


async def test_brokers_racing_to_announce_different_stores_exactly_one_wins(
    tmp_path: Path, prefix: str
) -> None:
    """Eight processes' brokers open at the same moment, each with a state
    store of its own: one wins, seven are refused, each naming the winner."""
    urls = [_url(prefix, f"sqlite:///{tmp_path}/s{i}.db") for i in range(8)]
    async with _brokers(*urls) as bs:
        got = await asyncio.gather(*(b.open() for b in bs), return_exceptions=True)
        won = [i for i, r in enumerate(got) if r is None]
        assert len(won) == 1, got
        winner = f"{tmp_path}/s{won[0]}.db"
        for r in got:
            if r is not None:
                assert isinstance(r, StateStoreConflict), r
                assert r.theirs is not None and winner in r.theirs


async def test_a_refused_process_records_nothing_and_sends_nothing(
    tmp_path: Path, prefix: str
) -> None:
    """A producer with another store must not enqueue: no record in its
    store, no copy in the queue for the app's workers to run."""
    async with _brokers(
        _url(prefix, f"sqlite:///{tmp_path}/a.db"), _url(prefix, f"sqlite:///{tmp_path}/b.db")
    ) as (a, b):
        await a.declare(["default"])
        with pytest.raises(StateStoreConflict):
            await b.enqueue([_job()])
        with pytest.raises(StateStoreConflict):
            await b.enqueue([_job(), _job()])
        with pytest.raises(StateStoreConflict):  # admin reads too: half a truth is a lie
            await b.stats()
        assert await b._store.kv_scan(b.keys.job) == {}
        assert await a.fetch(["default"], 10, 30.0, 0) == []
        assert [s.queue for s in await a.stats()] == ["default"]


async def test_the_error_names_a_server_store_without_its_password(
    tmp_path: Path, prefix: str
) -> None:
    """A PostgreSQL state store announced first (trust auth: the password
    is accepted and ignored); a SQLite one is refused.  The message names
    both, the PostgreSQL URL with its password masked."""
    parts = urlsplit(postgres_url(tmp_path))
    user = parts.username or "postgres"
    pg = urlunsplit(parts._replace(netloc=f"{user}:s3cret-pw@{parts.hostname}:{parts.port}"))
    async with _brokers(_url(prefix, pg), _url(prefix, f"sqlite:///{tmp_path}/b.db")) as (a, b):
        await a.open()
        with pytest.raises(StateStoreConflict) as info:
            await b.open()
    text = str(info.value)
    assert "s3cret-pw" not in text and f"{user}:***@" in text
    assert f"{tmp_path}/b.db" in text and "reset-identity" in text
    assert info.value.theirs is not None and f"{user}:***@" in info.value.theirs
    assert info.value.ours is not None and f"{tmp_path}/b.db" in info.value.ours


async def test_one_store_named_by_two_urls_is_one_store(tmp_path: Path, prefix: str) -> None:
    """The identity is the store's own id, not its URL: a Redis store named
    by its address and by a host name is one store, and both processes run."""
    by_address = redis_url(tmp_path)
    assert "127.0.0.1" in by_address
    by_name = by_address.replace("127.0.0.1", "localhost", 1)
    async with _brokers(_url(prefix, by_address), _url(prefix, by_name)) as (a, b):
        await a.open()
        await b.open()
        assert a.capabilities.multi_host and b.capabilities.multi_host
        [jid] = await a.enqueue([_job()])
        assert (await b.get(jid)) is not None


async def test_the_default_state_store_is_one_file_from_any_working_directory(
    tmp_path: Path, prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Written by a process in one directory, read by one in another: the
    default state store is the same file (the old default was relative)."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    for d in ("one", "two"):
        (tmp_path / d).mkdir()
    url = _url(prefix)
    monkeypatch.chdir(tmp_path / "one")
    async with _brokers(url) as [a]:
        [jid] = await a.enqueue([_job()])
    monkeypatch.chdir(tmp_path / "two")
    async with _brokers(url) as [b]:
        assert (await b.get(jid)) is not None
        assert b.state_url is not None and str(tmp_path / "state" / "dumbwaiter") in b.state_url


async def test_reset_identity_refuses_while_a_process_runs_then_moves_the_app(
    tmp_path: Path, prefix: str, hosts: list[Host]
) -> None:
    """Moving the app to another store on purpose: refused while a worker of
    the old store runs; once it stopped, forgotten, and the new store's
    processes start."""
    old, new = (
        _url(prefix, f"sqlite:///{tmp_path}/old.db"),
        _url(prefix, f"sqlite:///{tmp_path}/new.db"),
    )
    h = Host(tmp_path, "a")
    hosts.append(h)
    worker = h.worker(old)
    await asyncio.to_thread(
        wait_until, lambda: len(_workers(f"sqlite:///{tmp_path}/old.db")) == 1, "the worker"
    )
    runner = CliRunner()
    reset = ["state", "reset-identity", "--url", new, "--yes"]
    r = await asyncio.to_thread(runner.invoke, main, reset)
    assert r.exit_code == 1 and "still running" in r.output, r.output
    async with _brokers(new) as [b]:
        with pytest.raises(StateStoreConflict):
            await b.open()
    await asyncio.to_thread(_stop, worker)
    r = await asyncio.to_thread(runner.invoke, main, reset)
    assert r.exit_code == 0 and "forgot" in r.output, r.output
    r = await asyncio.to_thread(runner.invoke, main, [*reset, "--json"])
    assert r.exit_code == 0 and '"forgotten": false' in r.output, r.output
    async with _brokers(new) as [b]:
        await b.open()
    async with _brokers(old) as [a]:  # and now the old store is the one refused
        with pytest.raises(StateStoreConflict):
            await a.open()


def _close_connections_of(b: RabbitMQBroker) -> int:
    """Close ``b``'s connections from the server side (what a RabbitMQ
    restart or a network cut does to it)."""
    ctl = shutil.which("rabbitmqctl") or "/usr/sbin/rabbitmqctl"
    if not os.path.exists(ctl):
        require_service("rabbitmqctl", False, f"{ctl} is needed to close a connection")
    out = subprocess.run(
        [ctl, "-q", "list_connections", "pid", "client_properties"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    name = f"dumbwaiter {b.names.prefix} {b.instance}"
    mine = [line.split()[0] for line in out.splitlines() if name in line]
    for pid in mine:
        subprocess.run([ctl, "-q", "close_connection", pid, "split test"], timeout=60, check=False)
    return len(mine)


async def test_a_process_cut_off_during_a_reset_is_refused_when_it_comes_back(
    tmp_path: Path, prefix: str
) -> None:
    """A process holds the announcement only while connected: cut off, it
    cannot stop a reset.  But it claims again on its new connection, so if
    another store was announced meanwhile it is refused there, never left
    running on its old store beside the new one."""
    old, new = (_url(prefix, f"sqlite:///{tmp_path}/{n}.db") for n in ("old", "new"))
    async with _brokers(old, new) as (a, b):
        await a.declare(["default"])
        assert await asyncio.to_thread(_close_connections_of, a) == 1
        assert await b.forget_state_identity()
        await b.open()  # the new store is the app's now
        with pytest.raises(StateStoreConflict):  # a's next call reconnects and is refused
            for _ in range(50):  # until a notices its connection is gone
                with contextlib.suppress(BrokerError):  # "the connection was lost"
                    await a.fetch(["default"], 1, 30.0, 0.1)
        with pytest.raises(StateStoreConflict):  # and its state store stays shut
            await a.kv_get(["anything"])
