"""Scripts are called by SHA and sent again when the server lost them."""

from __future__ import annotations

import pytest
import redis

import dumbwaiter as dw
from dumbwaiter.brokers import from_url
from dumbwaiter.brokers.redis.lua import NAMES, load
from dumbwaiter.errors import BrokerError
from tests.conformance.conftest import msg

from .conftest import RedisServer


def _flush_scripts(server: RedisServer) -> None:
    client = redis.Redis(port=server.port)
    try:
        client.script_flush()
    finally:
        client.close()


def test_every_script_compiles(redis_server: RedisServer) -> None:
    client = redis.Redis(port=redis_server.port)
    try:
        for name in NAMES:
            script = load(name)
            assert client.script_load(script.source).encode() == script.sha, name
    finally:
        client.close()


async def test_calls_survive_script_flush(redis_server: RedisServer) -> None:
    broker = from_url(redis_server.url())
    try:
        await broker.enqueue([msg()])
        _flush_scripts(redis_server)
        assert len(await broker.fetch(["default"], 10, 30.0, 0)) == 1
        _flush_scripts(redis_server)
        ids = await broker.enqueue([msg() for _ in range(2500)])  # several chunks, pipelined
        assert len(set(ids)) == 2500
        [stats] = await broker.stats()
        assert (stats.ready, stats.running) == (2500, 1)
    finally:
        await broker.close()


def test_sync_enqueue_survives_script_flush(redis_server: RedisServer) -> None:
    app = dw.App(redis_server.url())
    task = app.task(name="t.job")(lambda: None)
    try:
        task.enqueue()
        _flush_scripts(redis_server)
        task.enqueue()
        _flush_scripts(redis_server)
        assert len(task.enqueue_many([()] * 1500)) == 1500
        _flush_scripts(redis_server)
        assert app.job(task.enqueue().id).status() == "ready"
    finally:
        app.close()


async def test_calls_survive_a_server_restart(redis_server: RedisServer) -> None:
    broker = from_url(redis_server.url())
    try:
        m = msg()
        await broker.enqueue([m])
        redis_server.stop()
        redis_server.start()  # same port and dir: the AOF brings the job back
        [d] = await _eventually_fetch(broker)
        assert d.id == m.id
    finally:
        await broker.close()


async def _eventually_fetch(broker: dw.brokers.Broker) -> list[dw.brokers.Delivery]:
    # the first call after the restart finds its pooled connection closed and
    # fails; the next one connects again
    for _ in range(3):
        try:
            return await broker.fetch(["default"], 10, 30.0, 0)
        except BrokerError:
            continue
    raise AssertionError("no fetch succeeded after the restart")


async def test_a_script_error_is_a_broker_error(redis_server: RedisServer) -> None:
    broker = from_url(redis_server.url())
    try:
        await broker.kv_set({"x": b"not a number"})
        with pytest.raises(BrokerError, match="not an integer"):
            await broker.kv_incr("x")
    finally:
        await broker.close()
