"""Events through the App and a real worker, on every broker: groups, versions,
inbox, replay, correlation."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

import dumbwaiter as dw
from dumbwaiter.event import replay
from dumbwaiter.state import State
from dumbwaiter.testing import drain
from tests.brokers import require_capability

FAST = dw.Retry(attempts=2, backoff=0.01, jitter=0)


class OrderCreated(dw.Event, type="order.created", version=2):
    order_id: str
    total_cents: int


class OrderCreatedV1(dw.Event, type="order.created", version=1):
    order_id: str
    total: float  # dollars, before version 2


class OrderPaid(dw.Event, type="order.paid"):
    order_id: str


@pytest.fixture
def app(make_app: Callable[..., dw.App], broker_name: str) -> dw.App:
    a = make_app(retry=FAST)
    require_capability(broker_name, a.broker.capabilities, "events")
    return a


def test_event_types_follow_the_rule() -> None:
    for bad in ("OrderCreated", "order", "order.Created", "order..created", "1order.x"):
        with pytest.raises(dw.ConfigurationError, match=r"domain\.action"):

            class Bad(dw.Event, type=bad):
                x: int

    with pytest.raises(dw.ConfigurationError, match="version must be an integer"):

        class BadVersion(dw.Event, type="order.shipped", version=0):
            x: int

    with pytest.raises(dw.ConfigurationError, match="needs a type"):

        class NoType(dw.Event):
            x: int

    with pytest.raises(dw.ConfigurationError, match="bump the version"):

        class Clash(dw.Event, type="order.created", version=2):
            other: str


async def test_every_group_gets_every_event(app: dw.App) -> None:
    got: dict[str, list[str]] = {"email": [], "billing": []}

    @app.subscribe(OrderCreated, group="email")
    def receipt(event: OrderCreated, ctx: dw.Context) -> None:
        got["email"].append(event.order_id)

    @app.subscribe(OrderCreated, group="billing")
    async def bill(event: OrderCreated) -> None:
        got["billing"].append(event.order_id)

    ids = [await app.apublish(OrderCreated(order_id=f"o-{i}", total_cents=100)) for i in range(5)]
    assert len(set(ids)) == 5
    await drain(app)
    assert sorted(got["email"]) == sorted(got["billing"]) == [f"o-{i}" for i in range(5)]


async def test_workers_in_a_group_share_its_events(app: dw.App) -> None:
    handled: list[str] = []
    all_done = asyncio.Event()
    # each worker runs at most 4 at once: a fifth running handler proves
    # that both hold events (the first could otherwise take all 60 before
    # the second's first fetch on a loaded machine), then all go on
    running = 0
    both_hold = asyncio.Event()

    @app.subscribe(OrderCreated, group="email")
    async def receipt(event: OrderCreated) -> None:
        nonlocal running
        running += 1
        if running > 4:
            both_hold.set()
        await both_hold.wait()
        handled.append(event.order_id)
        if len(handled) == 60:
            all_done.set()

    for i in range(60):
        await app.apublish(OrderCreated(order_id=f"o-{i}", total_cents=1))
    w1 = dw.Worker(app, concurrency=4)
    w2 = dw.Worker(app, concurrency=4)
    runs = [asyncio.create_task(w.run()) for w in (w1, w2)]
    await all_done.wait()
    w1.stop()
    w2.stop()
    await asyncio.gather(*runs)
    assert sorted(handled) == sorted(f"o-{i}" for i in range(60))  # each once
    assert w1.counts["succeeded"] > 0 and w2.counts["succeeded"] > 0


async def test_a_failing_group_has_its_own_retries_and_dead_letters(app: dw.App) -> None:
    billed: list[str] = []

    @app.subscribe(OrderCreated, group="email", retry=dw.Retry(attempts=3, backoff=0.01))
    def receipt(event: OrderCreated) -> None:
        raise ConnectionError("smtp down")

    @app.subscribe(OrderCreated, group="billing")
    def bill(event: OrderCreated) -> None:
        billed.append(event.order_id)

    await app.apublish(OrderCreated(order_id="o-1", total_cents=5))
    await drain(app)
    assert billed == ["o-1"]
    stats = {s.queue: s for s in await app.broker.stats()}
    assert stats["group:email"].dead == 1 and stats["group:billing"].succeeded == 1
    [dead] = (await app.broker.list_jobs(dw.brokers.JobFilter(queue="group:email"))).items
    assert [e.type for e in dead.message.errors] == ["ConnectionError"] * 3


async def test_older_versions_are_upcast_and_bad_payloads_dead_lettered(app: dw.App) -> None:
    seen: list[OrderCreated] = []

    @app.subscribe(OrderCreated, group="email")
    def receipt(event: OrderCreated) -> None:
        seen.append(event)

    @app.upcast("order.created", from_version=1)
    def dollars_to_cents(payload: dict[str, Any]) -> dict[str, Any]:
        return {"order_id": payload["order_id"], "total_cents": round(payload.pop("total") * 100)}

    await app.apublish(OrderCreatedV1(order_id="old", total=12.5))
    await app.apublish(OrderCreated(order_id="new", total_cents=99))
    await drain(app)
    assert sorted((e.order_id, e.total_cents) for e in seen) == [("new", 99), ("old", 1250)]
    assert all(type(e) is OrderCreated for e in seen)  # always the version subscribed with

    app.upcasters.clear()
    await app.apublish(OrderCreatedV1(order_id="stranded", total=1.0))
    w = await drain(app)
    assert w.counts["dead"] == 1
    [dead] = (await app.broker.list_jobs(dw.brokers.JobFilter(state=State.DEAD))).items
    err = dead.message.errors[0]
    assert err.type == "dumbwaiter.errors.InvalidArguments"
    assert 'no @app.upcast("order.created", from_version=1)' in err.message
    assert dead.message.attempt == 1  # not retried: it cannot work until code changes


async def test_payload_that_does_not_validate_is_dead_lettered(app: dw.App) -> None:
    @app.subscribe(OrderCreated, group="email")
    def receipt(event: OrderCreated) -> None: ...

    from dumbwaiter.event import event_message

    msg = event_message(OrderCreated(order_id="x", total_cents=1), None, None)
    msg.payload = {"order_id": "x", "total_cents": "not a number"}
    await app._declare()
    await app.broker.publish([msg])
    await drain(app)
    [dead] = (await app.broker.list_jobs(dw.brokers.JobFilter(state=State.DEAD))).items
    assert "total_cents" in dead.message.errors[0].message
    assert "does not validate as OrderCreated version 2" in dead.message.errors[0].message


async def test_publish_takes_an_event_and_checks_it(
    app: dw.App, make_app: Callable[..., dw.App]
) -> None:
    app = make_app(max_message_size=200)
    with pytest.raises(dw.ConfigurationError, match=r"dw\.Event instance"):
        await app.apublish({"order_id": "x"})  # type: ignore[arg-type]
    with pytest.raises(dw.PayloadTooLarge):
        await app.apublish(OrderCreated(order_id="x" * 500, total_cents=1))
    with pytest.raises(Exception, match="total_cents"):
        OrderCreated(order_id="x", total_cents="many")  # type: ignore[arg-type]


async def test_events_from_handlers_carry_correlation_and_cause(app: dw.App) -> None:
    seen: dict[str, dict[str, Any]] = {}

    @app.subscribe(OrderCreated, group="billing")
    async def bill(event: OrderCreated, ctx: dw.Context) -> None:
        seen["created"] = {"event_id": ctx.event_id, "corr": ctx.correlation_id}
        await app.apublish(OrderPaid(order_id=event.order_id))

    @app.subscribe(OrderPaid, group="email")
    def paid(event: OrderPaid, ctx: dw.Context) -> None:
        seen["paid"] = {
            "event_id": ctx.event_id,
            "corr": ctx.correlation_id,
            "cause": ctx.causation_id,
        }

    first = await app.apublish(OrderCreated(order_id="o-9", total_cents=1))
    await drain(app)
    assert seen["created"] == {"event_id": first, "corr": first}
    assert seen["paid"]["corr"] == first  # the whole chain shares the first event's id
    assert seen["paid"]["cause"] == first and seen["paid"]["event_id"] != first


async def test_inbox_drops_duplicates_and_replay_respects_it(app: dw.App) -> None:
    runs: list[str] = []

    @app.subscribe(OrderCreated, group="email")
    def receipt(event: OrderCreated) -> None:
        runs.append(event.order_id)

    @app.subscribe(OrderCreated, group="audit")
    def audit(event: OrderCreated) -> None: ...

    await app.apublish(OrderCreated(order_id="o-1", total_cents=1))
    await drain(app)
    assert runs == ["o-1"]

    # a replay to a group that already handled the events: harmless
    assert await replay(app, "order.created", "email") == 1
    w = await drain(app)
    assert runs == ["o-1"] and w.counts["duplicates"] == 1

    # forced: runs again (rebuilding a projection from the log)
    assert await replay(app, "order.created", "email", force=True) == 1
    await drain(app)
    assert runs == ["o-1", "o-1"]


async def test_replay_for_a_new_group_and_since(app: dw.App) -> None:
    import time

    for i in range(3):
        await app.apublish(OrderCreated(order_id=f"old-{i}", total_cents=1))
    cut = time.time()
    await app.apublish(OrderCreated(order_id="new", total_cents=1))
    late: list[str] = []

    @app.subscribe(OrderCreated, group="late")  # a consumer that did not exist yet
    def catch_up(event: OrderCreated) -> None:
        late.append(event.order_id)

    assert await replay(app, "order.created", "late", since=cut) == 1
    await drain(app)
    assert late == ["new"]
    assert await replay(app, "order.created", "late") == 4
    await drain(app)
    assert sorted(late) == ["new", "old-0", "old-1", "old-2"]  # "new" was handled already


def test_sync_publish_from_plain_code(app: dw.App) -> None:
    got: list[str] = []

    @app.subscribe(OrderPaid, group="email")
    def paid(event: OrderPaid) -> None:
        got.append(event.order_id)

    event_id = app.publish(OrderPaid(order_id="o-5"), key="o-5")
    asyncio.run(drain(app))
    assert got == ["o-5"] and len(event_id) == 36
    app.close()
