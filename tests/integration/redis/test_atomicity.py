"""Scripts are atomic: concurrent fetchers, waiters and producers never see a
job twice, and a unique key is held by one job however many race for it."""

from __future__ import annotations

import asyncio

from dumbwaiter.brokers import from_url
from dumbwaiter.brokers.base import Broker
from tests.conformance.conftest import msg


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
        await asyncio.sleep(0.1)
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
