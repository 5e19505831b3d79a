"""Bulk enqueue: staged chunks, one commit, all or nothing (see bulk.py)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import pytest
import redis

import dumbwaiter as dw
from dumbwaiter.brokers import from_url
from dumbwaiter.brokers.redis import RedisBroker, bulk
from dumbwaiter.errors import PayloadTooLarge
from dumbwaiter.message import Message
from tests.conformance.conftest import msg
from tests.conformance.helpers import fetch_all

from .conftest import RedisServer

N = bulk.CHUNK * 3 + 500  # four chunks: three staged while the next is encoded


def _keys(server: RedisServer) -> list[bytes]:
    client = redis.Redis(port=server.port)
    try:
        return sorted(client.scan_iter(count=1000))
    finally:
        client.close()


def _client(server: RedisServer) -> redis.Redis:
    return redis.Redis(port=server.port)


class Boom(Exception):
    pass


def _failing(n: int, after: int) -> Iterator[Message]:
    for i in range(n):
        if i == after:
            raise Boom("the caller's iterator failed")
        yield msg(args=[i])


async def test_a_big_batch_is_stored_whole_in_order(redis_server: RedisServer) -> None:
    broker = from_url(redis_server.url())
    try:
        ms = [msg(args=[i]) for i in range(N)]
        assert await broker.enqueue(iter(ms)) == [m.id for m in ms]
        got = [d.message.args[0] for d in await fetch_all(broker) if d.message]
        assert got == list(range(N))
        assert not [k for k in _keys(redis_server) if b":stage" in k]
    finally:
        await broker.close()


@pytest.mark.parametrize("after", [10, bulk.CHUNK + 10, 3 * bulk.CHUNK + 10])
async def test_a_failing_iterator_stores_nothing(redis_server: RedisServer, after: int) -> None:
    broker = from_url(redis_server.url())
    try:
        with pytest.raises(Boom):
            await broker.enqueue(_failing(N, after))
        assert await broker.stats() == [] or (await broker.stats())[0].ready == 0
        assert not [k for k in _keys(redis_server) if b":job:" in k or b":stage" in k]
    finally:
        await broker.close()


def test_a_failing_iterator_stores_nothing_sync(redis_server: RedisServer) -> None:
    app = dw.App(redis_server.url())
    try:
        with pytest.raises(Boom):
            app.broker.enqueue_sync(_failing(N, 2 * bulk.CHUNK + 1))
        assert not [k for k in _keys(redis_server) if b":job:" in k or b":stage" in k]
    finally:
        app.close()


async def test_a_message_too_large_half_way_stores_nothing(redis_server: RedisServer) -> None:
    broker = from_url(redis_server.url())
    broker.max_message_size = 1000
    ms = [msg(args=[i]) for i in range(N)]
    ms[2 * bulk.CHUNK + 7] = msg(args=["x" * 2000])
    try:
        with pytest.raises(PayloadTooLarge):
            await broker.enqueue(ms)
        assert not [k for k in _keys(redis_server) if b":job:" in k]
    finally:
        await broker.close()


async def test_keys_in_a_big_batch_hold(redis_server: RedisServer) -> None:
    broker = from_url(redis_server.url())
    try:
        first = msg(key="k-early")
        await broker.enqueue([first])
        ms = [msg(args=[i]) for i in range(N)]
        ms[5] = msg(key="k-early")  # held by the job enqueued before
        ms[bulk.CHUNK + 3] = msg(key="k-twice")
        ms[3 * bulk.CHUNK + 3] = msg(key="k-twice")  # held by the one above
        ids = await broker.enqueue(ms)
        assert ids[5] == first.id
        assert ids[3 * bulk.CHUNK + 3] == ms[bulk.CHUNK + 3].id
        assert [i for k, i in enumerate(ids) if k not in (5, 3 * bulk.CHUNK + 3)] == [
            m.id for k, m in enumerate(ms) if k not in (5, 3 * bulk.CHUNK + 3)
        ]
        assert len(await fetch_all(broker)) == N - 2 + 1
    finally:
        await broker.close()


def _flushing(server: RedisServer, n: int, at: int) -> Iterator[Message]:
    """Flush the server's scripts while the batch is being staged."""
    for i in range(n):
        if i == at:
            client = _client(server)
            client.script_flush()
            client.close()
        yield msg(args=[i])


def _killing(server: RedisServer, n: int, at: int) -> Iterator[Message]:
    """Drop every client connection while the batch is being staged."""
    for i in range(n):
        if i == at:
            client = _client(server)
            client.client_kill_filter(_type="normal", skipme=True)
            client.close()
        yield msg(args=[i])


@pytest.mark.parametrize("trouble", [_flushing, _killing], ids=["script-flush", "client-kill"])
def test_trouble_while_staging_falls_back_and_stores_each_job_once(
    redis_server: RedisServer, trouble: Callable[[RedisServer, int, int], Iterator[Message]]
) -> None:
    app = dw.App(redis_server.url())
    try:
        ids = app.broker.enqueue_sync(trouble(redis_server, N, 2 * bulk.CHUNK + 5))
    finally:
        app.close()
    assert len(ids) == len(set(ids)) == N
    client = _client(redis_server)
    try:
        assert client.zcard("{dw:t}:ready:default") == N
        assert client.zcard("{dw:t}:ids") == N
    finally:
        client.close()
    assert not [k for k in _keys(redis_server) if b":stage" in k]


async def test_what_a_dead_producer_staged_is_deleted(redis_server: RedisServer) -> None:
    broker = from_url(redis_server.url())
    assert isinstance(broker, RedisBroker)
    try:
        chunk = next(bulk.encode([msg() for _ in range(10)], None))
        link = broker._link()
        await link.script(
            broker._lua.enqueue,
            broker._keys,
            [repr(time.time()), b"stage1", "call-1", repr(time.time() - 1), *chunk.args],
        )
        assert [k for k in _keys(redis_server) if b":job:" in k]
        await broker.rescue()
        assert not [k for k in _keys(redis_server) if b":job:" in k or b":stage" in k]
        assert await broker.fetch(["default"], 100, 30.0, 0) == []
    finally:
        await broker.close()
