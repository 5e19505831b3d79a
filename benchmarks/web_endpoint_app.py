"""The web app that ``web_endpoint.py`` serves with uvicorn, and its worker's App.

One FastAPI app, three routes that differ only in what follows the save:

* ``POST /orders/save``: the order's row, INSERTed and committed through the
  app's own psycopg pool on PostgreSQL (the "save"; the same database for
  every broker);
* ``POST /orders/dw``: the save, then two ``aenqueue`` and one ``apublish``
  of a ``dw.Event`` (what examples/fastapi/main.py does);
* ``POST /orders/bare``: the save, then the same three messages through the
  broker's own client, the way a hand-written producer would make them:
  redis-py LPUSH, LPUSH, XADD; psycopg INSERT, INSERT, INSERT, each committed;
  nats-py JetStream publish three times, each acknowledged.
* ``POST /orders/floor`` (PostgreSQL only): the save, then the writes the dw
  route must make, with bare psycopg, one autocommitted statement each: a
  job row into the broker's ``dw_jobs`` (its indexes and count trigger) with
  the ``pg_notify`` that wakes a worker, twice; then the event's row into
  ``dw_events`` and its delivery's job row into ``dw_jobs``, with its
  ``pg_notify``, in one statement.  The bodies are the envelopes dumbwaiter
  stores (``Task.message``, ``event_message``, ``delivery_of``, ``encode``),
  so a running worker runs the floor's jobs as it runs the dw route's.

The broker comes from ``DW_BENCH_URL`` (the worker process imports ``app``
from here with the same variable).  Each route times the save and each of
the three calls inside the endpoint (``GET /timings``), so the load client's
latency can be split into the endpoint's own parts and the rest (HTTP,
server, scheduling), and ``POST /profile/start|stop`` runs cProfile over the
server's event loop thread.
"""

from __future__ import annotations

import cProfile
import io
import os
import pstats
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any
from urllib.parse import parse_qsl, urlsplit

import orjson
from fastapi import FastAPI
from pydantic import BaseModel

import dumbwaiter as dw
from dumbwaiter.brokers.types import delivery_of
from dumbwaiter.contrib.fastapi import lifespan
from dumbwaiter.event import event_message
from dumbwaiter.message import encode, uuid7

URL = os.environ.get("DW_BENCH_URL", "memory://")
#: the database the save writes to (every variant, every broker)
SAVE_DSN = os.environ.get("DW_BENCH_SAVE_DSN", "postgresql://127.0.0.1:5432/test")
#: names of this run's tables, lists, stream (made and dropped by web_endpoint.py)
TAG = os.environ.get("DW_BENCH_TAG", "bench_web")
POOL = int(os.environ.get("DW_BENCH_POOL", "8"))

app = dw.App(URL)


class BenchOrderCreated(dw.Event, type="bench.web_endpoint.order_created", version=1):
    order_id: str
    total_cents: int


@app.task(queue="bench_web_email")
async def send_receipt(order_id: str, email: str) -> None:
    """Stands in for a mail: nothing to do, so the worker's cost is the queue's."""


@app.task(queue="bench_web_hooks")
async def notify_partner(order_id: str, total_cents: int) -> None:
    """Stands in for a webhook."""


@app.subscribe(BenchOrderCreated, group="bench_web_analytics")
async def track(event: BenchOrderCreated) -> None:
    """Stands in for an analytics consumer."""


class Order(BaseModel):
    id: str
    email: str
    total_cents: int


class Timings:
    """Wall time of the save and of each call after it, per route, in
    microseconds: what the endpoint itself spends, apart from HTTP."""

    def __init__(self) -> None:
        self.parts: dict[str, list[list[float]]] = {}

    def add(self, route: str, parts: list[float]) -> None:
        self.parts.setdefault(route, []).append(parts)

    def summary(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for route, rows in self.parts.items():
            cols = list(zip(*rows, strict=True))
            out[route] = {"n": len(rows), "p50_us": [_median(c) for c in cols]}
        return out


def _median(xs: tuple[float, ...] | list[float]) -> float:
    s = sorted(xs)
    n = len(s)
    return (s[n // 2] + s[(n - 1) // 2]) / 2 if n else 0.0


def _body(kind: str, order: Order) -> bytes:
    """What a hand-written producer stores: an id and the arguments, as JSON."""
    return orjson.dumps({"id": uuid.uuid4().hex, "kind": kind, "order": order.model_dump()})


class Live:
    """What the server process holds open: the save's pool, the bare client's
    call, the endpoint timings and the profiler (one server, one event loop)."""

    save_pool: Any = None
    bare: Callable[[Order, int], Awaitable[None]] | None = None
    floor: Callable[[Order, int], Awaitable[None]] | None = None
    timings = Timings()
    profile: cProfile.Profile | None = None


def _plain(url: str) -> str:
    """The URL without dumbwaiter's options (the bare clients do not know them)."""
    return urlsplit(url)._replace(query="").geturl()


async def _redis_bare() -> Callable[[], Awaitable[None]]:
    import redis.asyncio as aredis

    client = aredis.Redis.from_url(_plain(URL), max_connections=POOL)

    async def one(order: Order, i: int) -> None:
        if i < 2:
            await client.lpush(f"{TAG}:q{i}", _body("job", order))
        else:
            await client.xadd(f"{TAG}:events", {"body": _body("event", order)})

    Live.bare = one
    return client.aclose


async def _postgres_bare() -> Callable[[], Awaitable[None]]:
    from psycopg_pool import AsyncConnectionPool

    # autocommit: each INSERT is its own committed transaction, one round trip
    pool: AsyncConnectionPool[Any] = AsyncConnectionPool(
        _plain(URL), min_size=POOL, max_size=POOL, kwargs={"autocommit": True}, open=False
    )
    await pool.open(wait=True)
    sql = f"INSERT INTO {TAG}_jobs (queue, body) VALUES (%s, %s)"

    async def one(order: Order, i: int) -> None:
        async with pool.connection() as conn:
            await conn.execute(sql, (f"q{i}", _body("job" if i < 2 else "event", order)))

    Live.bare = one
    Live.floor = _postgres_floor(pool)
    return pool.close


def _postgres_floor(pool: Any) -> Callable[[Order, int], Awaitable[None]]:
    """The floor route's three statements (see the module docstring), on the
    bare route's pool; the schema is the broker URL's."""
    schema = '"' + dict(parse_qsl(urlsplit(URL).query)).get("schema", "public") + '"'
    channel = "dumbwaiter:" + schema.strip('"')
    job_sql = (
        f"WITH ins AS (INSERT INTO {schema}.dw_jobs (id, queue, name, kind, max_attempts,"
        " msg_key, body) VALUES (%s, %s, %s, %s, %s, %s, %s) RETURNING queue)"
        " SELECT pg_notify(%s, queue) FROM ins"
    ).encode()
    event_sql = (
        f"WITH ev AS (INSERT INTO {schema}.dw_events (id, type, body) VALUES (%s, %s, %s)"
        f" RETURNING id), ins AS (INSERT INTO {schema}.dw_jobs (id, queue, name, kind,"
        " max_attempts, msg_key, body) SELECT %s, %s, %s, %s, %s, %s, %s FROM ev"
        " RETURNING queue) SELECT pg_notify(%s, queue) FROM ins"
    ).encode()
    [binding] = app.bindings()

    async def one(order: Order, i: int) -> None:
        if i < 2:
            task, args = (
                (send_receipt, (order.id, order.email))
                if i == 0
                else (notify_partner, (order.id, order.total_cents))
            )
            m = task.message(args, {})
            sql, params = job_sql, [m.id, m.queue, m.name, m.kind, m.max_attempts, m.key, encode(m)]
        else:
            event = BenchOrderCreated(order_id=order.id, total_cents=order.total_cents)
            ev = event_message(event, None, None)
            d = delivery_of(ev, binding, uuid7())
            sql = event_sql
            params = [ev.id, ev.name, encode(ev), d.id, d.queue, d.name, d.kind]
            params += [d.max_attempts, d.key, encode(d)]
        async with pool.connection() as conn:
            await (await conn.execute(sql, [*params, channel])).fetchall()

    return one


async def _nats_bare() -> Callable[[], Awaitable[None]]:
    import nats

    nc = await nats.connect(_plain(URL))
    js = nc.jetstream()

    async def one(order: Order, i: int) -> None:  # each publish waits for its ack
        name = f"q{i}" if i < 2 else "events"
        await js.publish(f"{nats_subject(TAG)}.{name}", _body("job" if i < 2 else "event", order))

    Live.bare = one
    return nc.close


def nats_subject(tag: str) -> str:
    """The bare client's subject root (and stream name) for a run's tag."""
    return tag.replace("_", "")


BARE: dict[str, Callable[[], Awaitable[Callable[[], Awaitable[None]]]]] = {
    "redis": _redis_bare,
    "postgresql": _postgres_bare,
    "postgres": _postgres_bare,
    "nats": _nats_bare,
}


@asynccontextmanager
async def resources(_api: FastAPI) -> AsyncIterator[None]:
    """The app's own database pool (the save) and the bare client, opened on
    the server's loop beside the App that ``lifespan`` opens."""
    from psycopg_pool import AsyncConnectionPool

    save_pool: AsyncConnectionPool[Any] = AsyncConnectionPool(
        SAVE_DSN, min_size=POOL, max_size=POOL, open=False
    )
    await save_pool.open(wait=True)
    Live.save_pool = save_pool
    opener = BARE.get(urlsplit(URL).scheme)
    close = await opener() if opener is not None else None
    try:
        yield
    finally:
        if close is not None:
            await close()
        await save_pool.close()


api = FastAPI(lifespan=lifespan(app, inner=resources))


async def _save(order: Order) -> None:
    async with Live.save_pool.connection() as conn:  # commits at the block's end
        await conn.execute(
            f"INSERT INTO {TAG}_orders (id, email, total_cents) VALUES (%s, %s, %s)",
            (order.id, order.email, order.total_cents),
        )


async def _dw_calls(order: Order, i: int) -> None:
    if i == 0:
        await send_receipt.aenqueue(order.id, order.email)
    elif i == 1:
        await notify_partner.aenqueue(order.id, order.total_cents)
    else:
        await app.apublish(BenchOrderCreated(order_id=order.id, total_cents=order.total_cents))


ROUTES = ("save", "dw", "bare", "floor")


@api.post("/orders/{route}", status_code=201)
async def create_order(route: str, order: Order) -> dict[str, str]:
    if route not in ROUTES:
        raise ValueError(f"unknown route {route!r}: one of {', '.join(ROUTES)}")
    clock = time.perf_counter
    t0 = clock()
    await _save(order)
    parts = [clock() - t0]
    call = {"dw": _dw_calls, "bare": Live.bare, "floor": Live.floor}.get(route)
    if call is not None:
        for i in range(3):
            t = clock()
            await call(order, i)
            parts.append(clock() - t)
    Live.timings.add(route, [p * 1e6 for p in parts])
    return {"id": order.id}


@api.get("/timings")
async def timings() -> dict[str, Any]:
    return Live.timings.summary()


@api.post("/timings/reset")
async def reset() -> dict[str, str]:
    Live.timings = Timings()
    return {"ok": "reset"}


@api.post("/profile/start")
async def profile_start(clock: str = "cpu") -> dict[str, str]:
    """``clock=cpu`` counts this thread's CPU only; ``wall`` also counts the
    time a call waited, off the CPU (a socket write that woke another
    process and lost the core to it shows there, not under ``cpu``)."""
    timer = {"cpu": time.thread_time, "wall": time.perf_counter}[clock]
    Live.profile = cProfile.Profile(timer)
    Live.profile.enable()
    return {"ok": "profiling"}


@api.post("/profile/stop")
async def profile_stop() -> dict[str, str]:
    prof = Live.profile
    if prof is None:
        raise ValueError("POST /profile/start first")
    prof.disable()
    Live.profile = None
    out = io.StringIO()
    st = pstats.Stats(prof, stream=out)
    st.sort_stats("tottime").print_stats(45)
    by: dict[str, float] = {}
    for (filename, _, _), (_, _, tottime, _, _) in st.stats.items():  # type: ignore[attr-defined]
        by[_package(filename)] = by.get(_package(filename), 0.0) + tottime
    total = sum(by.values()) or 1.0
    shares = sorted(((k, v / total) for k, v in by.items()), key=lambda kv: -kv[1])
    rest = sum(v for _, v in shares if v < 0.01)
    head = "".join(f"  {k:<16} {v:6.1%}\n" for k, v in shares if v >= 0.01)
    head += f"  {'the rest':<16} {rest:6.1%}\n"
    return {"tottime": f"share of the profiled time, by package:\n{head}\n{out.getvalue()}"}


def _package(filename: str) -> str:
    """Who a profiled function belongs to: a site-packages distribution,
    dumbwaiter, this endpoint, the standard library, or a builtin."""
    if "site-packages/" in filename:
        return filename.split("site-packages/", 1)[1].split("/", 1)[0]
    if "/dumbwaiter/" in filename:
        return "dumbwaiter"
    if filename.endswith("web_endpoint_app.py"):
        return "the endpoint"
    if "/lib/python3" in filename:
        return "stdlib " + filename.rsplit("/lib/python3", 1)[1].split("/")[1].removesuffix(".py")
    return "builtins" if filename == "~" else filename
