"""Scripts are atomic: concurrent fetchers, waiters and producers never see a
job twice, and a unique key is held by one job however many race for it."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from dumbwaiter.brokers import from_url
from dumbwaiter.brokers.base import Broker
from dumbwaiter.errors import BrokerError
from tests.conformance.conftest import msg
from tests.conformance.helpers import until_fetch_waits


async def _brokers(url: str, n: int) -> list[Broker]:
    out = [from_url(url) for _ in range(n)]
    for b in out:
        await b.open()
    return out


async def test_fetchers_and_waiters_racing_producers_get_each_job_once(shared_url: str) -> None:
    """Eight consumers (each alternately claiming and waiting as an idle
    worker) against four producers: every job is delivered exactly once,
    whether it was claimed from the ready set or handed to a waiter."""
    consumers = await _brokers(shared_url, 8)
    producers = await _brokers(shared_url, 4)
    total = 2000
    got: list[str] = []
    done = asyncio.Event()

    async def consume(b: Broker, k: int) -> None:
        while not done.is_set():
            ds = await b.fetch(["default", "other"], 1 + k % 5, 30.0, 0.05, f"w{k}")
            got.extend(d.id for d in ds)
            if ds:
                await b.ack(ds)
            if len(got) >= total:
                done.set()

    async def produce(b: Broker, k: int) -> list[str]:
        ids: list[str] = []
        for i in range(total // 4 // 10):
            queue = "other" if (i + k) % 3 == 0 else "default"
            ids += await b.enqueue([msg(queue=queue, args=[k, i, j]) for j in range(10)])
            await asyncio.sleep(0.001 * (k % 2))
        return ids

    try:
        tasks = [asyncio.create_task(consume(b, k)) for k, b in enumerate(consumers)]
        made = await asyncio.gather(*(produce(b, k) for k, b in enumerate(producers)))
        await asyncio.wait_for(done.wait(), 60)
        await asyncio.gather(*tasks)
    finally:
        for b in consumers + producers:
            await b.close()
    enqueued = {i for ids in made for i in ids}
    assert len(enqueued) == total
    assert len(got) == len(set(got)) == total
    assert set(got) == enqueued


async def test_racing_producers_store_a_key_once(shared_url: str) -> None:
    producers = await _brokers(shared_url, 6)
    try:
        results = await asyncio.gather(
            *(b.enqueue([msg(key=f"k{i}") for i in range(50)]) for b in producers)
        )
        for i in range(50):
            assert len({r[i] for r in results}) == 1  # every producer got the same id
        [stats] = await producers[0].stats()
        assert stats.ready == 50
    finally:
        for b in producers:
            await b.close()


async def test_one_waiter_gets_one_batch(shared_url: str) -> None:
    """A waiter registered on two queues is handed jobs once: by whichever
    enqueue comes first; the other queue's job waits in its ready set."""
    waiter, producer = await _brokers(shared_url, 2)
    try:
        waiting = asyncio.create_task(waiter.fetch(["a", "b"], 10, 30.0, 30.0, "w"))
        await until_fetch_waits(waiter, "a")  # registered on both in one script
        await until_fetch_waits(waiter, "b")
        first, second = msg(queue="a"), msg(queue="b")
        await asyncio.gather(producer.enqueue([first]), producer.enqueue([second]))
        ds = await asyncio.wait_for(waiting, 10)
        assert len(ds) == 1
        left = await producer.fetch(["a", "b"], 10, 30.0, 0)
        assert {d.id for d in ds + left} == {first.id, second.id}
        stats = {s.queue: s for s in await producer.stats()}
        assert stats["a"].running + stats["b"].running == 2
    finally:
        await waiter.close()
        await producer.close()


async def test_enqueue_after_wait_lapsed_goes_to_ready(shared_url: str) -> None:
    waiter, producer = await _brokers(shared_url, 2)
    try:
        assert await waiter.fetch(["default"], 10, 30.0, 0.05) == []
        m = msg()
        await producer.enqueue([m])
        [stats] = await producer.stats()
        assert (stats.ready, stats.running) == (1, 0)  # nobody was waiting
    finally:
        await waiter.close()
        await producer.close()


async def test_a_kv_write_between_an_updates_read_and_write_makes_it_decide_again(
    shared_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another process writes a key the update read (or only read: ``guard``),
    after the read and before the write: the update writes nothing on that
    read and decides again on the new values.  (A read then a plain write
    overwrote the other process's value with a stale decision.)"""
    b, other = await _brokers(shared_url, 2)
    await b.kv_set({"acc": b"1", "guard": b"open"})
    home = b.home  # type: ignore[attr-defined]  # the keyspace kv_update reads through
    real = home.kv_get
    seen: list[dict[str, bytes]] = []

    async def read_then_write(keys: Any) -> Any:
        got = await real(keys)
        if len(seen) == 0:
            await other.kv_set({"guard": b"closed"})
        return got

    monkeypatch.setattr(home, "kv_get", read_then_write)

    def decide(got: dict[str, bytes]) -> tuple[dict[str, bytes], bytes]:
        seen.append(dict(got))
        if got["guard"] != b"open":
            return {}, got["guard"]
        return {"acc": b"%d" % (int(got["acc"]) + 1)}, b"open"

    try:
        assert await b.kv_update(["acc", "guard"], decide) == b"closed"
        assert [d["guard"] for d in seen] == [b"open", b"closed"]
        assert await other.kv_get(["acc"]) == {"acc": b"1"}
    finally:
        for x in (b, other):
            await x.close()


async def test_an_update_that_never_settles_raises_broker_error(
    shared_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every round meets another writer: after ``KV_UPDATE_ATTEMPTS`` rounds
    the update gives up with a ``BrokerError`` naming the keys, having
    written nothing."""
    from dumbwaiter.brokers.redis import coordination as module

    monkeypatch.setattr(module, "KV_UPDATE_ATTEMPTS", 3)
    b, other = await _brokers(shared_url, 2)
    home = b.home  # type: ignore[attr-defined]  # the keyspace kv_update reads through
    real = home.kv_get
    rounds = 0

    async def read_then_write(keys: Any) -> Any:
        nonlocal rounds
        got = await real(keys)
        rounds += 1
        await other.kv_set({"hot": b"%d" % rounds})
        return got

    monkeypatch.setattr(home, "kv_get", read_then_write)
    try:
        with pytest.raises(BrokerError, match="hot"):
            await b.kv_update(["hot"], lambda got: ({"hot": b"mine"}, None))
        assert rounds == 3
        assert await other.kv_get(["hot"]) == {"hot": b"3"}
    finally:
        for x in (b, other):
            await x.close()
