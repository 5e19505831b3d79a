"""Search by key on PostgreSQL is an index probe (migration 0006), on new and
upgraded schemas, whatever path stored the job; migrations numbered with a
gap (0006 before another change's 0005) apply in any order."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import orjson
import psycopg
import pytest
from click.testing import CliRunner

from dumbwaiter.brokers.postgres import PostgresBroker, migrations
from dumbwaiter.brokers.postgres.broker import COPY_MIN
from dumbwaiter.brokers.postgres.migrations import migration_sql
from dumbwaiter.brokers.sql.filters import POSTGRES, where
from dumbwaiter.brokers.types import Binding, JobFilter
from dumbwaiter.cli import main
from dumbwaiter.errors import ConfigurationError
from dumbwaiter.message import EVENT, Message, encode, uuid7
from dumbwaiter.sqldb import adapt
from tests.conformance.conftest import msg
from tests.integration.postgres import server

Make = Callable[..., PostgresBroker]


def _sql(query: str, params: Any = None) -> list[Any]:
    with psycopg.connect(server.SERVER, autocommit=True) as conn:
        cur = conn.execute(query.encode(), params)
        return cur.fetchall() if cur.description else []


async def _keys(broker: PostgresBroker, key: str) -> list[str]:
    page = await broker.list_jobs(JobFilter(key=key), limit=1000)
    return [i.message.id for i in page.items]


def _plan(prefix: str, f: JobFilter, suffix: str = "") -> str:
    """The plan of an admin statement (``prefix`` + the filter's conditions)."""
    conds, params = where(f, POSTGRES)
    with psycopg.connect(server.SERVER, autocommit=True) as conn, conn.transaction():
        conn.execute(b"SET LOCAL enable_seqscan = off")  # a small table: judge the indexes
        rows = conn.execute(("EXPLAIN " + prefix + conds + suffix).encode(), params).fetchall()
    return "\n".join(r[0] for r in rows)


async def test_search_by_key_probes_the_index(make_broker: Make) -> None:
    broker = make_broker()
    target = msg(key="order-42")
    await broker.enqueue([target, *(msg(args=[i]) for i in range(200))])
    listing = _plan(
        broker.q.list_prefix,
        JobFilter(key="order-42", queue="default"),
        broker.q.list_suffix.replace("%s", "51"),
    )
    # the holder's unique key, and the message keys of jobs that hold none
    assert "dw_jobs_key" in listing and "dw_jobs_msg_key" in listing, listing
    assert "Seq Scan" not in listing, listing
    purge = _plan(broker.q.purge_prefix, JobFilter(key="order-42"))
    assert "dw_jobs_key" in purge and "dw_jobs_msg_key" in purge, purge
    assert await _keys(broker, "order-42") == [target.id]


async def test_every_enqueue_path_stores_the_key(make_broker: Make, schema: str) -> None:
    """COPY (async and sync, with delayed rows inserted apart), the multi-row
    and one-row inserts, event deliveries and the outbox's fast path."""
    broker = make_broker()
    await broker.open()
    copied = [msg(key=f"copy-{i}") for i in range(COPY_MIN * 2)]
    copied.append(msg(key="copy-later", eta=time.time() + 3600))  # not for COPY
    copied.append(msg())  # no key
    await broker.enqueue(copied)
    synced = [msg(key=f"sync-{i}") for i in range(COPY_MIN)]
    broker.enqueue_sync(synced)
    few = [msg(key="few-1"), msg(key="few-2")]
    await broker.enqueue(few)
    one = msg(key="one")
    broker.enqueue_sync([one])
    await broker.declare(["group:g"], [Binding("k.happened", "group:g", 3)])
    event = Message(
        id=uuid7(),
        kind=EVENT,
        name="k.happened",
        queue="",
        payload={},
        key="event-1",
        created_at=time.time(),
    )
    await broker.publish([event])
    outboxed = msg(key="outbox-1")
    with psycopg.connect(server.SERVER) as conn:  # the application's own transaction
        broker.enqueue_with_sync(adapt(conn), [outboxed])
        conn.commit()

    assert await _keys(broker, "copy-0") == [copied[0].id]
    assert await _keys(broker, f"copy-{COPY_MIN * 2 - 1}") == [copied[COPY_MIN * 2 - 1].id]
    assert await _keys(broker, "copy-later") == [copied[-2].id]
    assert await _keys(broker, "sync-7") == [synced[7].id]
    assert await _keys(broker, "few-2") == [few[1].id]
    assert await _keys(broker, "one") == [one.id]
    found = (await broker.list_jobs(JobFilter(key="event-1"))).items
    assert [(i.message.queue, i.message.key) for i in found] == [("group:g", "event-1")]
    assert await _keys(broker, "outbox-1") == [outboxed.id]
    [(n,)] = _sql(f'SELECT count(*) FROM "{schema}".dw_jobs WHERE msg_key IS NOT NULL')
    assert n == COPY_MIN * 2 + 1 + COPY_MIN + 2 + 1 + 1 + 1


def _version_4(schema: str, rows: list[tuple[Any, ...]]) -> None:
    """A schema as dumbwaiter made it before migration 0006, with jobs in it."""
    with psycopg.connect(server.SERVER, autocommit=True) as conn, conn.transaction():
        conn.execute(f'CREATE SCHEMA "{schema}"')
        conn.execute(f'SET LOCAL search_path TO "{schema}"')
        for version in (1, 2, 3, 4):
            conn.execute(migration_sql(version).encode())
        conn.cursor().executemany(
            b"INSERT INTO dw_jobs (id, queue, name, kind, state, max_attempts, key, body)"
            b" VALUES (%s, 'default', 't.job', %s, %s, 4, %s, %s)",
            rows,
        )


def _body(id: str, key: str | None, kind: str = "task", **kw: Any) -> bytes:
    return encode(Message(id=id, kind=kind, name="t.job", queue="default", key=key, **kw))


@pytest.mark.parametrize("broken_bodies", [False, True], ids=["json", "with-broken-bodies"])
async def test_an_upgraded_schema_finds_the_jobs_stored_before(
    make_url: Callable[..., str], schema: str, broken_bodies: bool
) -> None:
    """Jobs of a version-4 schema: a key's holder, a holder whose key a newer
    job freed (the key only in its body), an event delivery, a job without a
    key, one whose key is not a string, and (the migration's slower second
    pass) bodies that are not JSON or not UTF-8.  `dumbwaiter migrate` fills
    msg_key from the bodies and fails on none of them."""
    holder, freed, newer, delivery, plain, odd, broken, binary = (uuid7() for _ in range(8))
    rows = [
        (holder, "task", "ready", "held-1", _body(holder, "held-1")),
        (freed, "task", "succeeded", None, _body(freed, "weekly")),
        (newer, "task", "ready", "weekly", _body(newer, "weekly")),
        (delivery, "event", "ready", None, _body(delivery, "o-1", kind=EVENT, payload={})),
        (plain, "task", "ready", None, _body(plain, None, kwargs={"key": "weekly"})),
        (odd, "task", "dead", None, orjson.dumps({"id": odd, "key": 7})),
    ]
    if broken_bodies:
        rows.append((broken, "task", "dead", None, b'not json "key" at all'))
        rows.append((binary, "task", "dead", None, b'{"key":"\xff\xfe"}'))
    _version_4(schema, rows)
    url = make_url(migrate="check")
    result = CliRunner().invoke(main, ["migrate", "--url", url])
    assert result.exit_code == 0, result.output
    assert "applied 0006_job_keys" in result.output
    assert "0004" not in result.output
    broker = PostgresBroker(url)
    try:
        assert await _keys(broker, "weekly") == sorted([freed, newer], reverse=True)
        assert await _keys(broker, "held-1") == [holder]
        assert await _keys(broker, "o-1") == [delivery]
        assert await _keys(broker, "7") == []
        assert await broker.enqueue([msg(key="weekly")]) == [newer]  # still held
    finally:
        await broker.close()


# -- migration numbers with a gap --------------------------------------------------


def test_pending_is_what_is_not_recorded() -> None:
    shipped = {m.version for m in migrations.migrations()}
    assert [m.version for m in migrations.pending({1, 2, 4})] == sorted(shipped - {1, 2, 4})
    assert migrations.pending(set(shipped)) == []
    assert migrations.unknown(set(shipped) | {10_000}) == {10_000}


def _fake(version: int, name: str) -> migrations.Migration:
    return migrations.Migration(
        version,
        name,
        f"CREATE TABLE dw_{name} (x int);\n"
        f"INSERT INTO dw_schema_version (version, name) VALUES ({version}, '{name}');\n",
    )


def _ship(monkeypatch: pytest.MonkeyPatch, shipped: list[migrations.Migration]) -> None:
    shipped = sorted(shipped, key=lambda m: m.version)
    monkeypatch.setattr(migrations, "migrations", lambda: shipped)
    monkeypatch.setattr(migrations, "SHIPPED", frozenset(m.version for m in shipped))
    monkeypatch.setattr(migrations, "SCHEMA_VERSION", shipped[-1].version)


@pytest.fixture
def with_a_lower_migration(monkeypatch: pytest.MonkeyPatch) -> Iterator[migrations.Migration]:
    """Two builds whose migration numbers cross, as 0005 and 0006 did: one
    ships a migration two numbers past today's last, the other also the one
    in between (merged later).  A schema the first migrated must still get
    the lower one from the second.  Yields the lower one, with the second
    build shipped."""
    top = max(m.version for m in migrations.migrations())
    later, lower = _fake(top + 2, "past_a_gap"), _fake(top + 1, "merged_later")
    _ship(monkeypatch, [*migrations.migrations(), later, lower])
    yield lower


async def test_a_schema_past_a_gap_still_gets_the_lower_migration(
    make_broker: Make, schema: str, with_a_lower_migration: migrations.Migration
) -> None:
    extra = with_a_lower_migration
    # a schema migrated by this build before the merge: every version but the gap's
    with psycopg.connect(server.SERVER, autocommit=True) as conn, conn.transaction():
        conn.execute(f'CREATE SCHEMA "{schema}"')
        conn.execute(f'SET LOCAL search_path TO "{schema}"')
        for m in migrations.migrations():
            if m.version != extra.version:
                conn.execute(m.sql.encode())
    with pytest.raises(ConfigurationError, match=f"without migration {extra.version}"):
        await make_broker(migrate="check").stats()
    assert [m.version for m in make_broker().migrate(dry_run=True)] == [extra.version]
    assert [m.version for m in make_broker().migrate()] == [extra.version]
    assert _sql(f'SELECT count(*) FROM "{schema}".dw_merged_later') == [(0,)]
    assert await make_broker(migrate="check").stats() == []
    assert make_broker().migrate() == []


async def test_a_recorded_version_this_build_lacks_is_refused(
    make_broker: Make, schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A version inside a gap, recorded by a build that ships it: newer code."""
    top = max(m.version for m in migrations.migrations())
    _ship(monkeypatch, [*migrations.migrations(), _fake(top + 2, "past_a_gap")])
    make_broker().migrate()
    _sql(
        f'INSERT INTO "{schema}".dw_schema_version (version, name) VALUES (%s, %s)',
        (top + 1, "from another build"),
    )
    with pytest.raises(ConfigurationError, match="upgrade dumbwaiter"):
        await make_broker(migrate="check").stats()
    with pytest.raises(ConfigurationError, match="upgrade dumbwaiter"):
        make_broker().migrate()
