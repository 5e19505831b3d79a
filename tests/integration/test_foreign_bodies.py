"""A message that is not an envelope, written straight into an engine's storage.

A foreign producer (another language, a script, a bad migration) writes a
job whose body is garbage bytes, text that is not JSON, bytes that are not
UTF-8, JSON that is not an object, or an object that is not an envelope.
On SQLite, PostgreSQL and Redis the worker must dead-letter it with the
reason and go on with the other jobs, and the dead letter must be what the
user can see and handle like any other: listed (``list_jobs``, ``dlq ls``),
counted (``stats``), shown with its raw body (``get``, ``dlq show``),
replayable (it dies again, with the same reason) and purgeable.  Everything
after the injection goes through the seam and the CLI only.
"""

from __future__ import annotations

import asyncio
import base64
import sqlite3
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from click.testing import CliRunner, Result

import dumbwaiter as dw
from dumbwaiter.brokers import from_url
from dumbwaiter.brokers.types import JobFilter
from dumbwaiter.cli import main
from dumbwaiter.message import uuid7
from dumbwaiter.state import State
from dumbwaiter.testing import drain
from tests.conformance.helpers import eventually
from tests.integration.postgres import server as pg
from tests.integration.redis import server as rd

BODIES = {
    "garbage-bytes": b"\x00\xff\xfe\x80 not a message \x81\x00",
    "text": b"hello from a shell script",
    "not-utf8-json": b'{"id": "\xff\xfe"}',
    "json-array": b"[1, 2, 3]",
    "json-string": b'"just a string"',
    "json-null": b"null",
    "json-object": b'{"order_id": 42, "action": "ship"}',
}

# -- how a foreign producer writes a ready job, engine by engine ----------------------


def _inject_sqlite(url: str, id_: str, body: bytes) -> None:
    """The row, and its count (docs/sqlite.md: the broker counts its own
    inserts, so a row written by another program counts itself)."""
    conn = sqlite3.connect(url.removeprefix("sqlite:///"))
    now = time.time()
    with conn:
        conn.execute(
            "INSERT INTO dw_jobs (id, queue, name, kind, state, run_at, updated_at,"
            " max_attempts, body) VALUES (?, 'default', 'foreign.job', 'task', 'ready',"
            " ?, ?, 1, ?)",
            (id_, now, now, body),
        )
        conn.execute(
            "INSERT INTO dw_counts (queue, state, n) VALUES ('default', 'ready', 1)"
            " ON CONFLICT (queue, state) DO UPDATE SET n = n + 1"
        )
    conn.close()


def _inject_postgres(url: str, id_: str, body: bytes) -> None:
    import psycopg

    schema = url.split("schema=")[1].split("&")[0]
    with psycopg.connect(pg.SERVER, autocommit=True) as conn:
        conn.execute(
            f'INSERT INTO "{schema}".dw_jobs (id, queue, name, kind, max_attempts, body)'
            " VALUES (%s, 'default', 'foreign.job', 'task', 1, %s)",
            (id_, body),
        )


def _inject_redis(url: str, id_: str, body: bytes) -> None:
    import redis

    prefix = "{dw:" + url.split("prefix=")[1].split("&")[0] + "}"
    now = time.time()
    client = redis.Redis.from_url(rd.SERVER)
    try:
        p = client.pipeline(transaction=True)
        p.hset(
            f"{prefix}:job:{id_}",
            mapping={"body": body, "q": "default", "n": "foreign.job", "pr": "0", "ma": "1",
                     "ra": repr(now), "u": repr(now), "st": "ready"},
        )  # fmt: skip
        p.zadd(f"{prefix}:ready:default", {f"{int(now * 1_000_000):016d}{id_}": 0})
        p.zadd(f"{prefix}:ids", {id_: 0})
        p.sadd(f"{prefix}:queues", "default")
        p.execute()
    finally:
        client.close()


def _sqlite_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path}/jobs.db"


def _postgres_url(tmp_path: Path) -> str:
    return pg.url(pg.new_schema())


def _redis_url(tmp_path: Path) -> str:
    return rd.url(rd.new_prefix())


ENGINES: dict[str, tuple[Callable[[Path], str], Callable[[str, str, bytes], None]]] = {
    "sqlite": (_sqlite_url, _inject_sqlite),
    "postgres": (_postgres_url, _inject_postgres),
    "redis": (_redis_url, _inject_redis),
}


@pytest.fixture(params=sorted(ENGINES))
def engine(
    request: pytest.FixtureRequest, tmp_path: Path
) -> Iterator[tuple[str, Callable[..., None]]]:
    make_url, inject = ENGINES[request.param]
    yield make_url(tmp_path), inject


def cli(url: str, *args: str) -> Result:
    result = CliRunner().invoke(main, [*args, "--url", url], catch_exceptions=False)
    return result


def _dead_ids(url: str) -> list[str]:
    out = cli(url, "dlq", "ls", "--json")
    assert out.exit_code == 0, out.output
    return [i["id"] for i in orjson.loads(out.output)["items"]]


def _stats(url: str) -> dict[str, Any]:
    out = cli(url, "stats", "--json")
    assert out.exit_code == 0, out.output
    data = orjson.loads(out.output)
    rows = data["queues"] if isinstance(data, dict) else data
    return next(r for r in rows if r["queue"] == "default")


def _shown_body(shown: dict[str, Any]) -> bytes:
    """The raw body as ``dlq show --json`` gives it: text when it is UTF-8,
    base64 when it is not."""
    if "raw_base64" in shown:
        return base64.b64decode(shown["raw_base64"])
    return str(shown["raw"]).encode()


@pytest.mark.parametrize("name", sorted(BODIES))
def test_a_foreign_body_is_a_dead_letter_like_any_other(
    engine: tuple[str, Callable[[str, str, bytes], None]], name: str
) -> None:
    url, inject = engine
    body = BODIES[name]
    app = dw.App(url, retry=dw.Retry.never())
    ran: list[int] = []

    @app.task
    def good(n: int) -> None:
        ran.append(n)

    try:
        asyncio.run(app.broker.open())
        good.enqueue(1)
        jid = uuid7()
        inject(url, jid, body)
        good.enqueue(2)
        asyncio.run(drain(app))
        assert sorted(ran) == [1, 2]  # the others ran

        # dead, with the reason and the body as it was written
        info = asyncio.run(app.broker.get(jid))
        assert info is not None and info.state is State.DEAD
        assert info.raw == body
        assert [e.type for e in info.message.errors] == ["dumbwaiter.errors.MessageDecodeError"]
        listed = asyncio.run(app.broker.list_jobs(JobFilter(state=State.DEAD))).items
        assert [i.message.id for i in listed] == [jid] and listed[0].raw == body

        # what the user sees
        assert _dead_ids(url) == [jid]
        counts = _stats(url)
        assert (counts["dead"], counts["ready"], counts["running"]) == (1, 0, 0)
        assert counts["succeeded"] == 2
        shown = cli(url, "dlq", "show", jid, "--json")
        assert shown.exit_code == 0, shown.output
        as_json = orjson.loads(shown.output)
        assert _shown_body(as_json) == body
        text = cli(url, "dlq", "show", jid)
        assert text.exit_code == 0 and "raw body" in text.output
        assert "MessageDecodeError" in text.output

        # replayed: it runs again and dies again, for the same reason
        replayed = cli(url, "dlq", "replay", jid)
        assert replayed.exit_code == 0 and "replayed 1 dead letter" in replayed.output
        asyncio.run(drain(app))
        again = asyncio.run(app.broker.get(jid))
        assert again is not None and again.state is State.DEAD and again.replays == 1
        assert again.raw == body
        assert [e.type for e in again.message.errors] == [
            "dumbwaiter.errors.MessageDecodeError"
        ] * 2
        assert _stats(url)["dead"] == 1

        # purged: gone from every view
        purged = cli(url, "dlq", "purge", jid, "--yes")
        assert purged.exit_code == 0, purged.output
        assert asyncio.run(app.broker.get(jid)) is None
        assert _dead_ids(url) == []
        assert _stats(url)["dead"] == 0
    finally:
        app.close()


@pytest.mark.parametrize("name", ["garbage-bytes", "json-array", "json-object"])
def test_a_foreign_job_whose_worker_died_is_buried_by_the_rescuer(
    engine: tuple[str, Callable[[str, str, bytes], None]], name: str
) -> None:
    """Its lease runs out (the worker died holding it), it was its last
    attempt: the rescuer dead-letters it like any job, and goes on."""
    url, inject = engine
    body = BODIES[name]

    async def main() -> None:
        broker = from_url(url)
        try:
            await broker.open()
            jid = uuid7()
            inject(url, jid, body)
            [d] = await broker.fetch(["default"], 10, 0.2, 0)  # and the worker dies
            assert (d.id, d.message, d.raw) == (jid, None, body)
            rescued = await eventually(broker.rescue, lambda r: r >= 1)
            assert [(x.id, x.message) for x in rescued.dead] == [(jid, None)]
            info = await broker.get(jid)
            assert info is not None and info.state is State.DEAD and info.raw == body
            assert [e.type for e in info.message.errors] == ["dumbwaiter.errors.LeaseExpired"]
        finally:
            await broker.close()

    asyncio.run(main())
