"""Retention: finished jobs, cancelled jobs and expired kv entries are
deleted by the rescuer with every trace of them; dead letters stay."""

from __future__ import annotations

from typing import cast

import redis

from dumbwaiter.brokers import from_url
from dumbwaiter.brokers.base import Broker
from dumbwaiter.brokers.types import JobFilter
from dumbwaiter.state import State
from tests.conformance.conftest import msg
from tests.conformance.helpers import error, eventually, fetch_all
from tests.integration.redis.server import SERVER, new_prefix, url


def _keys(prefix: str) -> set[bytes]:
    client = redis.Redis.from_url(SERVER)
    try:
        return set(client.scan_iter(match=f"{{dw:{prefix}}}:*", count=1000))
    finally:
        client.close()


async def _gone(broker: Broker, id: str) -> None:
    async def probe() -> bool:
        await broker.rescue()
        return await broker.get(id) is None

    await eventually(probe, bool)


async def test_finished_jobs_are_pruned_and_dead_letters_kept() -> None:
    prefix = new_prefix()
    broker = from_url(url(prefix, retention="0.3"))
    try:
        plain, kept, failed, cancelled = msg(key="once"), msg(), msg(), msg()
        await broker.enqueue([plain, kept, failed])
        ds = {d.id: d for d in await broker.fetch(["default"], 10, 30.0, 0)}
        await broker.enqueue([cancelled])
        ds[kept.id].result, ds[kept.id].result_ttl = b'{"value": 1}', 1.0
        await broker.ack([ds[plain.id], ds[kept.id]])
        ds[failed.id].error = error()
        await broker.dead([ds[failed.id]])
        assert await broker.cancel([cancelled.id]) == [cancelled.id]

        await _gone(broker, plain.id)
        await _gone(broker, cancelled.id)
        info = await broker.get(kept.id)  # its result is kept longer than the retention
        assert info is not None and info.result == b'{"value": 1}'
        await _gone(broker, kept.id)

        assert (await broker.get(failed.id)).state is State.DEAD  # type: ignore[union-attr]
        [stats] = await broker.stats()
        assert (stats.succeeded, stats.cancelled, stats.dead) == (0, 0, 1)
        page = await broker.list_jobs(JobFilter(), None, 10)
        assert [i.message.id for i in page.items] == [failed.id]
        # the unique key was released with its job
        again = msg(key="once")
        assert await broker.enqueue([again]) == [again.id]
        job_keys = {k for k in _keys(prefix) if b":job:" in k}
        assert job_keys == {f"{{dw:{prefix}}}:job:{i}".encode() for i in (failed.id, again.id)}
    finally:
        await broker.close()


async def test_expired_kv_entries_are_swept() -> None:
    prefix = new_prefix()
    broker = from_url(url(prefix))
    try:
        await broker.kv_set({"short": b"1"}, ttl=0.1)
        await broker.kv_set({"long": b"2"})
        client = redis.Redis.from_url(SERVER)

        async def swept() -> list[bytes]:
            await broker.rescue()  # no read in between: the sweep itself deletes it
            return list(cast(list[bytes], client.hkeys(f"{{dw:{prefix}}}:kv")))

        try:
            await eventually(swept, lambda keys: keys == [b"long"])
            assert client.zcard(f"{{dw:{prefix}}}:kvx") == 0
        finally:
            client.close()
    finally:
        await broker.close()


async def test_one_rescue_prunes_more_than_one_call_does() -> None:
    """More jobs finish per second than one script call prunes: rescue()
    calls it again until they are all gone."""
    prefix = new_prefix()
    broker = from_url(url(prefix, retention="0.2"))
    try:
        n = 2500
        await broker.enqueue([msg() for _ in range(n)])
        await broker.ack(await fetch_all(broker))

        async def left_after_rescue() -> int:
            await broker.rescue()
            return (await broker.stats())[0].succeeded

        seen: list[int] = []

        def none_left(k: int) -> bool:
            seen.append(k)
            return k == 0

        await eventually(left_after_rescue, none_left)
        assert set(seen) <= {0, n}  # nothing yet, or everything in one rescue()
    finally:
        await broker.close()


async def test_compact_records_hold_six_fields_and_are_pruned_with_their_count() -> None:
    """A succeeded task without ``keep_result`` keeps a hash of six small
    fields, in no sorted set (ack.lua), and the rescuer prunes it from the
    head of ``fin`` after the retention, its count with it."""
    prefix = new_prefix()
    broker = from_url(url(prefix, retention="0.3"))
    client = redis.Redis.from_url(SERVER)
    p = f"{{dw:{prefix}}}"
    try:
        ms = [msg(args=["x" * 500]) for _ in range(3)]
        await broker.enqueue(ms)
        for d in await fetch_all(broker):
            d.result = b'{"started": 1.0, "finished": 2.0}'
            await broker.ack([d])
        for m in ms:
            assert set(cast(dict[bytes, bytes], client.hgetall(f"{p}:job:{m.id}"))) == {
                b"st",
                b"q",
                b"n",
                b"a",
                b"s",
                b"u",
            }
            assert client.zscore(f"{p}:ids", m.id) is None
            assert client.zscore(f"{p}:done", m.id) is None
        assert client.lrange(f"{p}:fin", 0, -1) == [m.id.encode() for m in ms]
        [stats] = await broker.stats()
        assert stats.succeeded == 3

        for m in ms:
            await _gone(broker, m.id)
        [stats] = await broker.stats()
        assert stats.succeeded == 0
        assert client.exists(f"{p}:fin") == 0
        assert not {k for k in _keys(prefix) if b":job:" in k}
    finally:
        client.close()
        await broker.close()
