"""Flow control at the seam: sliding-window rate limits and concurrency slots."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import pytest

from dumbwaiter.brokers.base import Broker
from tests.brokers import require_capability

from .conftest import msg
from .helpers import eventually


@pytest.fixture(autouse=True)
def _needs_limits(broker: Broker, broker_name: str) -> None:
    require_capability(broker_name, broker.capabilities, "limits")


async def test_rate_limit_is_a_sliding_window(broker: Broker) -> None:
    t = 1_000_000.0
    assert [await broker.rate_limit("k", 3, 1.0, t + i / 10) for i in range(3)] == [0.0] * 3
    assert await broker.rate_limit("k", 3, 1.0, t + 0.5) == pytest.approx(0.5)  # t+0 leaves at t+1
    assert await broker.rate_limit("other", 3, 1.0, t + 0.5) == 0.0  # keys are independent
    assert await broker.rate_limit("k", 3, 1.0, t + 1.0) == 0.0  # [t, t+1) had 3: t+1 is new


async def test_rate_limit_checks_every_window_when_permits_come_out_of_order(
    broker: Broker,
) -> None:
    t = 2_000_000.0
    for at in (t + 0.9, t + 1.0, t + 1.1):  # a fast worker stamped later starts first
        assert await broker.rate_limit("k", 3, 1.0, at) == 0.0
    # a slow worker's start at t+0.5 would put 4 in [t+0.5, t+1.5)
    assert await broker.rate_limit("k", 3, 1.0, t + 0.5) > 0
    assert await broker.rate_limit("k", 3, 1.0, t - 0.2) == 0.0  # [t-0.2, t+0.8) has room


async def test_rate_limit_holds_under_concurrent_takers(
    make_broker: Callable[[], Broker],
) -> None:
    brokers = [make_broker() for _ in range(4)]
    for b in brokers:
        await b.open()
    taken: list[float] = []

    async def take(b: Broker) -> None:
        for _ in range(10):
            if await b.rate_limit("api", 5, 60.0, time.time()) == 0.0:
                taken.append(time.time())

    await asyncio.gather(*(take(b) for b in brokers))
    assert len(taken) == 5  # 40 tries, 5 permits a minute


async def test_concurrency_slots(broker: Broker) -> None:
    assert await broker.slot_acquire("tenant:a", 2, "job-1", 30.0)
    assert await broker.slot_acquire("tenant:a", 2, "job-2", 30.0)
    assert not await broker.slot_acquire("tenant:a", 2, "job-3", 30.0)
    assert await broker.slot_acquire("tenant:a", 2, "job-1", 30.0)  # already its holder
    assert await broker.slot_acquire("tenant:b", 2, "job-3", 30.0)  # another key
    await broker.slot_release([("tenant:a", "job-1")])
    assert await broker.slot_acquire("tenant:a", 2, "job-3", 30.0)


async def test_expired_slots_free_themselves_unless_extended(broker: Broker) -> None:
    assert await broker.slot_acquire("k", 2, "crashed", 0.2)
    assert await broker.slot_acquire("k", 2, "alive", 0.2)
    await broker.slot_extend([("k", "alive")], 60.0)
    await eventually(lambda: broker.slot_acquire("k", 2, "next", 60.0), lambda ok: ok)
    assert not await broker.slot_acquire("k", 2, "third", 60.0)  # "alive" still holds


async def test_requeue_at_a_time_does_not_charge_the_attempt(broker: Broker) -> None:
    m = msg()
    await broker.enqueue([m])
    [d] = await broker.fetch(["default"], 1, 30.0, 0)
    d.retry_at = time.time() + 0.3
    await broker.requeue([d])
    assert await broker.fetch(["default"], 1, 30.0, 0) == []  # held back
    [again] = await asyncio.wait_for(broker.fetch(["default"], 1, 30.0, 30.0), 10)
    assert again.id == m.id and again.message is not None and again.message.attempt == 1


async def test_unique_while_active_frees_the_key_when_the_job_finished(broker: Broker) -> None:
    a = msg(key="report:42", headers={"unique": "active"})
    assert await broker.enqueue([a]) == [a.id]
    b = msg(key="report:42", headers={"unique": "active"})
    assert await broker.enqueue([b]) == [a.id]  # queued: the same job
    [d] = await broker.fetch(["default"], 1, 30.0, 0)
    assert await broker.enqueue([b]) == [a.id]  # running: still the same job
    await broker.ack([d])
    c = msg(key="report:42", headers={"unique": "active"})
    assert await broker.enqueue([c]) == [c.id]  # finished: a new job may run
    assert await broker.enqueue([msg(key="report:42", headers={"unique": "active"})]) == [c.id]


async def test_unique_while_queued_lets_a_new_job_in_once_one_runs(broker: Broker) -> None:
    a = msg(key="debounce:x", headers={"unique": "queued"})
    await broker.enqueue([a])
    assert await broker.enqueue([msg(key="debounce:x", headers={"unique": "queued"})]) == [a.id]
    await broker.fetch(["default"], 1, 30.0, 0)
    b = msg(key="debounce:x", headers={"unique": "queued"})
    assert await broker.enqueue([b]) == [b.id]


async def test_reschedule_moves_jobs_that_have_not_started(broker: Broker) -> None:
    a, b = msg(), msg()
    await broker.enqueue([a, b])
    [running] = await broker.fetch(["default"], 1, 30.0, 0)
    waiting = b if running.id == a.id else a
    later = time.time() + 3600
    assert await broker.reschedule([a.id, b.id], later) == [waiting.id]
    info = await broker.get(waiting.id)
    assert info is not None and info.state.value == "scheduled"
    assert info.run_at == pytest.approx(later, abs=1e-6)  # PostgreSQL keeps microseconds
    assert await broker.reschedule([waiting.id], 0) == [waiting.id]
    assert [d.id for d in await broker.fetch(["default"], 1, 30.0, 0)] == [waiting.id]
