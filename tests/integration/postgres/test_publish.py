"""A publish is one statement made from the bindings a broker remembers
(issue 25.5): a binding another process adds or changes after that broker
read them must still be delivered to, with its own retry policy, and an
event whose publish had to read the bindings again is logged and delivered
once, never twice nor zero times."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import cast

import psycopg
import pytest

from dumbwaiter.brokers.postgres import PostgresBroker
from dumbwaiter.brokers.types import Binding
from dumbwaiter.sqldb import adapt
from tests.conformance.test_events import event
from tests.integration.postgres import server
from tests.integration.postgres.test_counts import _sql

Make = Callable[..., PostgresBroker]


def _deliveries(schema: str) -> list[tuple[str, str, int]]:
    """(event id, queue, max_attempts) of every stored delivery, sorted."""
    rows = _sql(
        f"SELECT convert_from(body, 'UTF8')::json -> 'headers' ->> 'event_id', queue,"
        f' max_attempts FROM "{schema}".dw_jobs ORDER BY 1, 2'
    )
    return [(str(e), str(q), int(cast(int, a))) for e, q, a in rows]


def _logged(schema: str) -> list[str]:
    return [str(r[0]) for r in _sql(f'SELECT id::text FROM "{schema}".dw_events ORDER BY 1')]


@pytest.mark.parametrize("sync", [False, True], ids=["async", "sync"])
async def test_a_binding_added_or_changed_elsewhere_is_delivered_to(
    make_broker: Make, sync: bool
) -> None:
    publisher, other = make_broker(), make_broker()
    await other.declare([], [Binding("order.created", "group:a", 3)])

    async def publish(n: int = 1) -> list[str]:
        evs = [event(order_id=f"o-{i}") for i in range(n)]
        if sync:
            made = await asyncio.to_thread(publisher.publish_sync, evs)
        else:
            made = await publisher.publish(evs)
        assert made == len(evs) * len(await asyncio.to_thread(_bindings, publisher.schema))
        return [e.id for e in evs]

    first = await publish()  # the publisher reads (and remembers) one binding
    # another process binds a second group and changes the first one's policy
    await other.declare([], [Binding("order.created", "group:b", 5)])
    await other.declare([], [Binding("order.created", "group:a", 7)])
    later = await publish(2)
    assert _deliveries(publisher.schema) == sorted(
        [(first[0], "group:a", 3)]
        + [(e, "group:a", 7) for e in later]
        + [(e, "group:b", 5) for e in later]
    )
    assert _logged(publisher.schema) == sorted(first + later)


def _bindings(schema: str) -> list[tuple[str, str, int]]:
    return [tuple(r) for r in _sql(f'SELECT * FROM "{schema}".dw_bindings')]  # type: ignore[misc]


@pytest.mark.parametrize("sync", [False, True], ids=["async", "sync"])
async def test_one_event_with_one_stale_binding_goes_where_the_database_says(
    make_broker: Make, sync: bool
) -> None:
    """One event of a type bound to one queue travels in scalars
    (queries.publish_one): a remembered binding whose policy changed, or
    that was replaced by another queue's, is checked there just the same."""
    publisher, other = make_broker(), make_broker()
    await other.declare([], [Binding("order.created", "group:a", 3)])

    async def publish() -> str:
        e = event()
        made = await (
            asyncio.to_thread(publisher.publish_sync, [e]) if sync else publisher.publish([e])
        )
        assert made == 1
        return e.id

    first = await publish()
    await other.declare([], [Binding("order.created", "group:a", 7)])
    changed = await publish()
    _sql(f'DELETE FROM "{publisher.schema}".dw_bindings')
    await other.declare([], [Binding("order.created", "group:c", 2)])
    replaced = await publish()
    assert _deliveries(publisher.schema) == sorted(
        [(first, "group:a", 3), (changed, "group:a", 7), (replaced, "group:c", 2)]
    )
    assert _logged(publisher.schema) == sorted([first, changed, replaced])


async def test_a_binding_removed_elsewhere_gets_nothing_more(make_broker: Make) -> None:
    publisher, other = make_broker(), make_broker()
    await other.declare(
        [], [Binding("order.created", "group:a", 3), Binding("order.created", "group:b", 3)]
    )
    one = event()
    assert await publisher.publish([one]) == 2
    # bindings are only ever removed by hand (SQL); the publisher must notice
    _sql(f"DELETE FROM \"{publisher.schema}\".dw_bindings WHERE queue = 'group:b'")
    two = event()
    assert await publisher.publish([two]) == 1
    assert _deliveries(publisher.schema) == sorted(
        [(one.id, "group:a", 3), (one.id, "group:b", 3), (two.id, "group:a", 3)]
    )
    # and a type bound nowhere is logged, delivered to nobody
    lone = event("order.shipped")
    assert await publisher.publish([lone]) == 0
    assert lone.id in _logged(publisher.schema)


async def test_a_duplicate_after_a_binding_changed_is_still_not_delivered_again(
    make_broker: Make,
) -> None:
    publisher, other = make_broker(), make_broker()
    await other.declare([], [Binding("order.created", "group:a", 3)])
    e = event()
    assert await publisher.publish([e]) == 1
    await other.declare([], [Binding("order.created", "group:b", 3)])
    assert await publisher.publish([e]) == 0  # read again, still a duplicate
    assert _deliveries(publisher.schema) == [(e.id, "group:a", 3)]


async def test_the_outbox_publish_with_a_stale_cache_commits_with_the_caller(
    make_broker: Make,
) -> None:
    publisher, other = make_broker(), make_broker()
    await other.declare([], [Binding("order.created", "group:a", 3)])
    assert await publisher.publish([event()]) == 1
    await other.declare([], [Binding("order.created", "group:b", 4)])
    kept, dropped = event(), event()
    with psycopg.connect(server.SERVER) as conn:  # a transaction of the application
        sql = adapt(conn)
        assert publisher.owns_connection_sync(sql)
        publisher.enqueue_with_sync(sql, [kept])
        conn.commit()
        publisher.enqueue_with_sync(sql, [dropped])
        conn.rollback()
    got = [d for d in _deliveries(publisher.schema) if d[0] in (kept.id, dropped.id)]
    assert got == sorted([(kept.id, "group:a", 3), (kept.id, "group:b", 4)])
    assert dropped.id not in _logged(publisher.schema)
