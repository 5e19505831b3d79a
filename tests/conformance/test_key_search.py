"""Admin search by key: ``JobFilter(key=...)`` matches ``Message.key`` exactly,
over every stored job (not a window of the newest), on every broker."""

from __future__ import annotations

import time

from dumbwaiter.brokers.base import Broker
from dumbwaiter.brokers.types import Binding, JobFilter
from dumbwaiter.message import EVENT, Message, uuid7
from dumbwaiter.state import State
from tests.brokers import require_capability

from .conftest import msg
from .helpers import fetch_all

#: jobs enqueued after the one searched for: more than a page, so an answer
#: from the newest jobs only would miss it
NEWER = 120


async def _listed(broker: Broker, f: JobFilter, limit: int = 50) -> list[str]:
    """Every id ``f`` lists, following cursors to the end."""
    seen: list[str] = []
    cursor: str | None = None
    while True:
        page = await broker.list_jobs(f, cursor, limit)
        seen += [i.message.id for i in page.items]
        if page.cursor is None:
            return seen
        cursor = page.cursor


async def test_list_by_key_finds_an_old_job_and_nothing_else(broker: Broker) -> None:
    old = msg(key="order-42")
    await broker.enqueue([old])
    # near misses: other keys that contain the key, the key's text in the
    # arguments and as a "key" argument, an unkeyed job
    near = [
        msg(key="order-420"),
        msg(key="order-4"),
        msg(key="x-order-42"),
        msg(args=["order-42"]),
        msg(kwargs={"key": "order-42"}),
        msg(name="other.task", kwargs={"k": {"key": "order-42"}}),
    ]
    await broker.enqueue(near)
    await broker.enqueue([msg(args=[i]) for i in range(NEWER)])

    assert await _listed(broker, JobFilter(key="order-42")) == [old.id]
    assert await _listed(broker, JobFilter(key="order-42"), limit=1) == [old.id]
    assert await _listed(broker, JobFilter(key="order-42", state=State.READY)) == [old.id]
    assert await _listed(broker, JobFilter(key="order-42", queue="default")) == [old.id]
    assert await _listed(broker, JobFilter(key="order-42", queue="email")) == []
    assert await _listed(broker, JobFilter(key="order-42", state=State.DEAD)) == []
    assert await _listed(broker, JobFilter(key="order-42", name="other.task")) == []
    assert await _listed(broker, JobFilter(key="order")) == []
    assert await _listed(broker, JobFilter(key="nope")) == []
    page = await broker.list_jobs(JobFilter(key="order-42"))
    assert [i.message.key for i in page.items] == ["order-42"]


async def test_list_by_key_with_characters_json_escapes(broker: Broker) -> None:
    """Keys whose JSON text an encoder may spell differently are still found."""
    keys = ['a"b', "tenant/7", "café-ü", "tab\there", "back\\slash"]
    ms = [msg(key=k) for k in keys]
    await broker.enqueue(ms)
    await broker.enqueue([msg(args=[k]) for k in keys])
    for k, m in zip(keys, ms, strict=True):
        assert await _listed(broker, JobFilter(key=k)) == [m.id], k


async def test_key_of_a_freed_holder_still_lists(broker: Broker) -> None:
    """A unique job frees the key of a finished holder: both carry the key."""
    first = msg(key="report:weekly", headers={"unique": "active"})
    await broker.enqueue([first])
    [d] = await broker.fetch(["default"], 1, 30.0, 0)
    await broker.ack([d])
    second = msg(key="report:weekly", headers={"unique": "active"})
    assert await broker.enqueue([second]) == [second.id]
    await broker.enqueue([msg(args=[i]) for i in range(NEWER)])

    assert await _listed(broker, JobFilter(key="report:weekly")) == [second.id, first.id]
    done = JobFilter(key="report:weekly", state=State.SUCCEEDED)
    assert await _listed(broker, done) == [first.id]


async def test_replay_and_purge_by_key(broker: Broker) -> None:
    dead = [msg(key=f"dead-{i}", max_attempts=1) for i in range(3)]
    await broker.enqueue(dead)
    ds = await fetch_all(broker)
    await broker.dead(ds)
    assert await broker.replay(JobFilter(key="dead-1")) == 1
    assert (await broker.get(dead[1].id)).state is State.READY  # type: ignore[union-attr]
    assert (await broker.get(dead[0].id)).state is State.DEAD  # type: ignore[union-attr]
    assert await broker.purge(JobFilter(key="dead-2")) == 1
    assert await broker.get(dead[2].id) is None
    assert (await broker.get(dead[0].id)).state is State.DEAD  # type: ignore[union-attr]
    assert await _listed(broker, JobFilter(key="dead-0")) == [dead[0].id]


async def test_list_by_key_finds_event_deliveries(broker: Broker, broker_name: str) -> None:
    """An event's ordering key rides on each job that delivers it."""
    require_capability(broker_name, broker.capabilities, "events")
    await broker.declare(["group:billing"], [Binding("order.paid", "group:billing", 3)])

    def event(key: str | None) -> Message:
        id_ = uuid7()
        return Message(
            id=id_,
            kind=EVENT,
            name="order.paid",
            queue="",
            payload={"order_id": key},
            headers={"schema_version": 1, "correlation_id": id_},
            created_at=time.time(),
            key=key,
        )

    await broker.publish([event("o-1")])
    await broker.publish([event(f"o-{i}") for i in range(2, 40)])
    # delivered and done: a job on every broker (Redis keeps an event in its
    # stream until a worker reads it; the job is made then)
    await broker.ack(await fetch_all(broker, "group:billing"))
    found = await broker.list_jobs(JobFilter(key="o-1"))
    assert [(i.message.queue, i.message.key) for i in found.items] == [("group:billing", "o-1")]
    assert found.cursor is None
    everything = await broker.list_jobs(JobFilter(queue="group:billing"), limit=1000)
    assert len(everything.items) == 39


async def test_purging_an_old_job_of_a_key_keeps_the_new_holders(broker: Broker) -> None:
    """Purging a job whose key a newer job took over must not free the key."""
    first = msg(key="report:daily", headers={"unique": "active"})
    await broker.enqueue([first])
    [d] = await broker.fetch(["default"], 1, 30.0, 0)
    await broker.ack([d])
    second = msg(key="report:daily", headers={"unique": "active"})
    assert await broker.enqueue([second]) == [second.id]
    assert await broker.purge(JobFilter(key="report:daily", state=State.SUCCEEDED)) == 1
    third = msg(key="report:daily", headers={"unique": "active"})
    assert await broker.enqueue([third]) == [second.id]
    assert await _listed(broker, JobFilter(key="report:daily")) == [second.id]
