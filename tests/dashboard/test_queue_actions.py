"""Bulk actions on a queue's page: retry (dead and failed jobs), delete, and
pause/resume; each acts on the selected jobs or on everything the page's
filter matches."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

import pytest
from starlette.testclient import TestClient

import dumbwaiter as dw
from dumbwaiter.state import State
from dumbwaiter.testing import drain
from tests.dashboard.conftest import Seeded, csrf, ids_on
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


def states(*ids: str) -> list[State | None]:
    async def go(app: dw.App) -> list[State | None]:
        out = []
        for i in ids:
            info = await app.broker.get(i)
            out.append(info.state if info else None)
        return out

    return broker_call(go)


@pytest.fixture
def crm(seeded: Seeded) -> list[str]:
    """Three crm jobs that failed once: retrying, their next attempt an hour away."""

    async def go(app: dw.App) -> list[str]:
        ids = [(await app.tasks["dashapp.sync_crm"].aenqueue(i)).id for i in range(3)]
        await drain(app, ["crm"], scheduled=False)
        return ids

    return broker_call(go)


def test_retry_selected_dead_and_retrying_jobs(
    client: TestClient, seeded: Seeded, crm: list[str]
) -> None:
    token = csrf(client.get("/queues/mail").text)
    one, two = seeded.dead
    r = client.post(
        "/actions/queue/retry",
        data={
            "csrf": token,
            "queue": "mail",
            "scope": "selected",
            "id": [one],
            "next": "/queues/mail",
        },
    )
    assert "replayed 1 dead job(s), 0 to run now" in r.text
    assert states(one, two) == [State.READY, State.DEAD]
    # a failed job waiting for its next attempt runs now
    before = time.time()
    r = client.post(
        "/actions/queue/retry",
        data={"csrf": token, "queue": "crm", "scope": "selected", "id": crm[0]},
    )
    assert "replayed 0 dead job(s), 1 to run now" in r.text

    async def run_at(app: dw.App) -> float | None:
        info = await app.broker.get(crm[0])
        assert info is not None
        return info.run_at

    assert states(crm[0]) == [State.READY] and (broker_call(run_at) or 0) <= time.time()
    assert (broker_call(run_at) or 0) >= before - 1
    assert states(*crm[1:]) == [State.RETRYING, State.RETRYING]


def test_retry_everything_failed_in_a_queue(
    client: TestClient, seeded: Seeded, crm: list[str]
) -> None:
    token = csrf(client.get("/queues/crm").text)
    r = client.post(
        "/actions/queue/retry",
        data={"csrf": token, "queue": "crm", "scope": "matching", "state": "retrying"},
    )
    assert "0 dead job(s), 3 to run now" in r.text
    assert states(*crm) == [State.READY] * 3
    # the dead tab's button replays every dead job of the queue, and only of it
    r = client.post(
        "/actions/queue/retry",
        data={"csrf": token, "queue": "mail", "scope": "matching", "state": "dead"},
    )
    assert "replayed 2 dead job(s)" in r.text
    assert states(*seeded.dead) == [State.READY, State.READY]
    # "all" needs the confirmation, as the dead-letter page does
    r = client.post(
        "/actions/queue/retry", data={"csrf": token, "queue": "mail", "scope": "matching"}
    )
    assert "refusing to act on every job of mail without all=1" in r.text
    # a state that cannot be retried
    r = client.post(
        "/actions/queue/retry",
        data={"csrf": token, "queue": "mail", "scope": "matching", "state": "ready"},
    )
    assert "ready jobs cannot be retried" in r.text


def test_delete_selected_and_matching(client: TestClient, seeded: Seeded) -> None:
    token = csrf(client.get("/queues/mail").text)
    r = client.post(
        "/actions/queue/delete",
        data={"csrf": token, "queue": "mail", "scope": "selected", "id": seeded.ready[:2]},
    )
    assert "deleted 2 jobs" in r.text
    assert states(*seeded.ready) == [None, None, State.READY]
    # the ready tab's "delete all matching": ready jobs only (the scheduled one stays)
    r = client.post(
        "/actions/queue/delete",
        data={"csrf": token, "queue": "mail", "scope": "matching", "state": "ready"},
    )
    assert "deleted 1 job" in r.text
    assert set(ids_on(client.get("/queues/mail").text)) == {*seeded.dead, seeded.scheduled}
    # narrowed by task: only that task's jobs
    r = client.post(
        "/actions/queue/delete",
        data={"csrf": token, "queue": "mail", "scope": "matching", "task": "flaky"},
    )
    assert "deleted 2 jobs" in r.text
    assert ids_on(client.get("/queues/mail").text) == [seeded.scheduled]
    # everything left, confirmed; another queue is untouched
    r = client.post(
        "/actions/queue/delete", data={"csrf": token, "queue": "mail", "scope": "matching"}
    )
    assert "refusing to act on every job of mail" in r.text
    r = client.post(
        "/actions/queue/delete",
        data={"csrf": token, "queue": "mail", "scope": "matching", "all": "1"},
    )
    assert "deleted 1 job" in r.text
    assert ids_on(client.get("/queues/mail").text) == []
    assert ids_on(client.get("/queues/reports").text) == [seeded.keyed]


def test_delete_never_touches_a_running_job(client: TestClient, seeded: Seeded) -> None:
    async def start(app: dw.App) -> str:
        [d] = await app.broker.fetch(["reports"], 1, 60.0, 0)
        return d.id

    running = broker_call(start)
    token = csrf(client.get("/queues/reports").text)
    r = client.post(
        "/actions/queue/delete",
        data={"csrf": token, "queue": "reports", "scope": "matching", "all": "1"},
    )
    assert "deleted 0 jobs" in r.text and states(running) == [State.RUNNING]
    r = client.post(
        "/actions/queue/delete",
        data={"csrf": token, "queue": "reports", "scope": "matching", "state": "running"},
    )
    assert "running jobs cannot be deleted" in r.text


def test_an_argument_search_is_not_a_bulk_filter(client: TestClient, seeded: Seeded) -> None:
    page = client.get("/queues/mail?args=u0").text
    assert ids_on(page) == [seeded.dead[0]]
    assert 'id="delete-matching"' not in page  # only "selected" is offered
    r = client.post(
        "/actions/queue/delete",
        data={"csrf": csrf(page), "queue": "mail", "scope": "matching", "args": "u0", "all": "1"},
    )
    assert "an argument search is not a filter the broker can apply" in r.text
    assert states(*seeded.dead, *seeded.ready) == [State.DEAD] * 2 + [State.READY] * 3


def test_the_queue_page_offers_the_bulk_actions(client: TestClient, seeded: Seeded) -> None:
    page = client.get("/queues/mail").text
    for button in ('id="retry-selected"', 'id="delete-selected"', 'id="retry-matching"'):
        assert button in page
    assert f'<input type="checkbox" name="id" value="{seeded.dead[0]}" form="bulk"' in page
    assert 'id="retry-matching"' not in client.get("/queues/mail?state=ready").text
    assert "Pause" in page


def test_pause_and_resume_hold_for_every_worker(client: TestClient, seeded: Seeded) -> None:
    token = csrf(client.get("/queues/reports").text)
    r = client.post("/actions/queue/pause", data={"csrf": token, "queue": "reports"})
    assert "paused reports" in r.text

    async def fetch(app: dw.App) -> list[str]:  # another process's worker
        ds = await app.broker.fetch(["reports"], 10, 30.0, 0)
        await app.broker.requeue(ds)
        return [d.id for d in ds]

    assert broker_call(fetch) == []
    client.post("/actions/queue/resume", data={"csrf": token, "queue": "reports"})
    assert broker_call(fetch) == [seeded.keyed]
