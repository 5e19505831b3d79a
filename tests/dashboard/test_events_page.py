"""The events page: recent events by type, their payload, and what each
subscriber group did with them."""

from __future__ import annotations

import asyncio
import html
import re
from collections.abc import Awaitable, Callable
from typing import TypeVar

import pytest
from starlette.testclient import TestClient

import dumbwaiter as dw
from dumbwaiter.brokers.types import JobFilter
from dumbwaiter.dashboard import create_app
from dumbwaiter.state import State
from dumbwaiter.testing import drain
from tests.dashboard.conftest import LOOPBACK, Seeded
from tests.dashboard.dashapp import OrderPaid
from tests.dashboard.dashapp import create_app as create_dashapp

T = TypeVar("T")


def broker_call(fn: Callable[[dw.App], Awaitable[T]]) -> T:
    async def go() -> T:
        app = create_dashapp()
        try:
            return await fn(app)
        finally:
            await app.aclose()

    return asyncio.run(go())


def rows(page: str) -> list[tuple[str, str, str]]:
    """(event id, the ledger group's status, payload text) per row, in order."""
    out = []
    for eid, body in re.findall(r'<tr data-event="([^"]+)">(.*?)</tr>', page, re.S):
        group = re.search(r'data-group="ledger">ledger <[^>]*class="state[^"]*">([^<]*)<', body)
        payload = re.search(r'<pre class="json">(.*?)</pre>', body, re.S)
        out.append(
            (
                eid,
                group.group(1) if group else "",
                html.unescape(payload.group(1)) if payload else "",
            )
        )
    return out


def publish(*orders: str) -> list[str]:
    async def go(app: dw.App) -> list[str]:
        ids = []
        for o in orders:
            event = OrderPaid(order=o)
            await app.apublish(event, key=o)
            ids.append(o)
        return ids

    return broker_call(go)


def event_ids(app_url: str) -> dict[str, str]:
    """order -> event id, from the log."""

    async def go(app: dw.App) -> dict[str, str]:
        page, _ = await app.broker.list_events("dashboard.order_paid")
        return {str(m.payload["order"]): m.id for m in page}  # type: ignore[index]

    return broker_call(go)


def test_events_page_shows_recent_events_payloads_and_their_groups(
    client: TestClient, seeded: Seeded
) -> None:
    publish("o-2", "bad")
    broker_call(lambda app: drain(app, ["group:ledger"]))
    publish("o-4")  # not handled yet
    ids = event_ids(seeded.url)
    r = client.get("/events")
    assert r.status_code == 200
    page = r.text
    assert 'data-type="dashboard.order_paid"' in page  # the type's tab
    got = rows(page)
    assert [g[0] for g in got] == [ids["o-4"], ids["bad"], ids["o-2"], ids["o-1"]]  # newest first
    status = {eid: s for eid, s, _ in got}
    assert status[ids["o-4"]] == "ready"
    assert status[ids["bad"]] == "dead"
    assert status[ids["o-2"]] == status[ids["o-1"]] == "succeeded"
    assert '"order": "o-4"' in got[0][2]  # the payload, whole
    # each status links to the delivery (a job of the group's queue)
    m = re.search(
        rf'<tr data-event="{ids["bad"]}">.*?href="/jobs/([^"]+)" class="state s-dead"', page, re.S
    )
    assert m
    assert "no such order: bad" in client.get(f"/jobs/{m.group(1)}").text
    # one type chosen; a type nobody knows shows nothing
    assert len(rows(client.get("/events?type=dashboard.order_paid").text)) == 4
    assert rows(client.get("/events?type=other.thing").text) == []


def test_a_pruned_delivery_still_shows_as_handled(client: TestClient, seeded: Seeded) -> None:
    """The group's inbox mark outlives the delivery job."""
    broker_call(lambda app: drain(app, ["group:ledger"]))

    async def prune(app: dw.App) -> int:
        return await app.broker.purge(JobFilter(queue="group:ledger", state=State.SUCCEEDED))

    assert broker_call(prune) == 1
    [(_, status, _)] = rows(client.get("/events").text)
    assert status == "handled"


def test_a_dashboard_without_code_finds_the_types_that_have_groups(seeded: Seeded) -> None:
    with TestClient(create_app(seeded.url, sample=False), client=LOOPBACK) as c:
        page = c.get("/events").text
    assert 'data-type="dashboard.order_paid"' in page
    [(_, status, payload)] = rows(page)
    assert status == "ready" and '"order": "o-1"' in payload


def test_paging_back_in_time_misses_no_event(client: TestClient, seeded: Seeded) -> None:
    publish(*[f"p-{i}" for i in range(24)])  # 25 with the seed's
    ids = set(event_ids(seeded.url).values())
    first = client.get("/events?limit=20").text
    seen = [r[0] for r in rows(first)]
    assert len(seen) == 20
    m = re.search(r'href="([^"]+)" rel="next"', first)
    assert m
    second = client.get("/events" + html.unescape(m.group(1))).text
    more = [r[0] for r in rows(second)]
    assert set(seen) | set(more) == ids  # an event may show on both pages, none is missed
    assert sorted(seen + [i for i in more if i not in seen], reverse=True) == sorted(
        ids, reverse=True
    )


@pytest.mark.parametrize("shape", ["uniform", "burst", "sparse"])
async def test_the_look_back_finds_the_newest_within_its_calls(
    shape: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The look back through growing windows, over a log whose publish times
    are set (2,000 events): it finds exactly the newest, narrowing windows
    that hold more than one call returns, within ``MAX_CALLS`` calls."""
    import time

    from dumbwaiter.brokers.memory import MemoryBroker
    from dumbwaiter.dashboard import events
    from dumbwaiter.message import EVENT, Message, uuid7_many

    now = time.time()
    n = 2000
    if shape == "uniform":  # 20 a second for 100 s
        at = [now - 100 + i * 0.05 for i in range(n)]
    elif shape == "burst":  # one a minute for a day, then 1,000 in the last 10 ms
        at = [now - 86400 + i * 86.4 for i in range(1000)] + [
            now - 0.01 + i * 0.00001 for i in range(1000)
        ]
    else:  # one an hour: most windows are empty
        at = [now - (n - i) * 3600.0 for i in range(n)]
    log = [
        Message(i, EVENT, "x.y", "", payload={"n": k}, created_at=t)
        for k, (i, t) in enumerate(zip(uuid7_many(n), at, strict=True))
    ]
    calls: list[int] = []

    async def list_events(
        event_type: str,
        since: float | None = None,
        until: float | None = None,
        cursor: str | None = None,
        limit: int = 500,
    ) -> tuple[list[Message], str | None]:
        calls.append(1)
        found = [
            m for m in log
            if (since is None or m.created_at >= since)
            and (until is None or m.created_at <= until)
            and (cursor is None or m.id > cursor)
        ]  # fmt: skip
        return found[:limit], (found[limit - 1].id if len(found) > limit else None)

    broker = MemoryBroker("memory://look-back")
    monkeypatch.setattr(broker, "list_events", list_events)
    monkeypatch.setattr(events, "LOOK_PAGE", 50)
    floor = now - 7 * 86400
    items, older = await events.newest(broker, "x.y", 20, None, floor, now)
    assert [m.payload["n"] for m in items] == list(range(n - 1, n - 21, -1))  # type: ignore[index]
    assert len(calls) <= events.MAX_CALLS
    # and on from there: the next 20, none skipped
    assert older is not None
    more, _ = await events.newest(broker, "x.y", 20, older, floor, now)
    shown = {m.payload["n"] for m in items + more}  # type: ignore[index]
    assert set(range(n - 39, n)) <= shown  # (the 20th may show on both pages)
