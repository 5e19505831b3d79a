"""Every page and every action of the dashboard, through Starlette's TestClient
on a real SQLite broker."""

from __future__ import annotations

import asyncio
import re
import sys
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

import orjson
import pytest
from starlette.testclient import TestClient

import dumbwaiter as dw
from dumbwaiter.brokers.types import JobFilter
from dumbwaiter.dashboard import create_app
from dumbwaiter.metrics import Snapshot
from dumbwaiter.state import State
from dumbwaiter.throughput import PREFIX, minute_of
from tests.dashboard.conftest import LOOPBACK, Seeded, cell, csrf, ids_on
from tests.dashboard.dashapp import create_app as create_dashapp

T = TypeVar("T")


def broker_call(seeded: Seeded, fn: Callable[[dw.App], Awaitable[T]]) -> T:
    """Run ``await fn(app)`` on a separate App (another process's view) with
    the test app's tasks."""

    async def go() -> T:
        app = create_dashapp()
        try:
            return await fn(app)
        finally:
            await app.aclose()

    return asyncio.run(go())


def test_overview_counts_every_queue_and_group(client: TestClient) -> None:
    r = client.get("/")
    assert r.status_code == 200
    page = r.text
    assert cell(page, "mail", "ready") == "3"
    assert cell(page, "mail", "scheduled") == "1"
    assert cell(page, "mail", "dead") == "2"
    assert cell(page, "reports", "ready") == "1"
    assert cell(page, "group:ledger", "ready") == "1"
    assert 'id="groups"' in page and "<svg" in page  # groups table, throughput chart
    assert re.search(r'id="total-ready">5<', page)
    assert 'hx-trigger="every 5s"' in page  # refreshes itself


def test_throughput_chart_from_worker_samples(client: TestClient, seeded: Seeded) -> None:
    """Two samples of a worker's counts a minute apart make one bar."""
    now = time.time()
    m = minute_of(now)

    def sample(at: float, succeeded: int, dead: int) -> bytes:
        return orjson.dumps({"at": at, "workers": {"w1": [succeeded, 0, dead, now - 3600]}})

    async def store(app: dw.App) -> None:
        await app.broker.kv_set(
            {
                f"{PREFIX}{m - 2}": sample(now - 120, 10, 0),
                f"{PREFIX}{m - 1}": sample(now - 60, 52, 3),
            }
        )

    broker_call(seeded, store)
    page = client.get("/").text
    assert "42 succeeded, 0 retried, 3 dead" in page
    assert re.search(r"last hour: 45 in \d+ sampled minutes", page)


def test_throughput_samples_are_written_once_per_minute(seeded: Seeded) -> None:
    from dumbwaiter.throughput import record_sample

    async def go(app: dw.App) -> list[bool]:
        worker = {"id": "w1", "counts": {"succeeded": 5}, "started_at": 1.0}
        snap = Snapshot(at=time.time(), stats=(), workers=(worker,))
        other = dw.App(seeded.url)  # a second sampler (another process)
        try:
            return [await record_sample(app.broker, snap), await record_sample(other.broker, snap)]
        finally:
            await other.aclose()

    assert broker_call(seeded, go) == [True, False]


def test_queue_detail_tabs_search_and_paging(client: TestClient, seeded: Seeded) -> None:
    page = client.get("/queues/mail").text
    assert set(ids_on(page)) == {*seeded.dead, *seeded.ready, seeded.scheduled}
    assert ids_on(page)[0] == seeded.scheduled  # newest first
    ready = client.get("/queues/mail?state=ready").text
    assert set(ids_on(ready)) == set(seeded.ready)
    assert set(ids_on(client.get("/queues/mail?state=dead").text)) == set(seeded.dead)
    assert ids_on(client.get("/queues/mail?state=scheduled").text) == [seeded.scheduled]
    # by task, by its full or its short name (as on the command line)
    page = client.get("/queues/mail?task=dashapp.flaky").text
    assert set(ids_on(page)) == set(seeded.dead)
    assert set(ids_on(client.get("/queues/mail?task=flaky").text)) == set(seeded.dead)
    # by key
    page = client.get("/queues/reports?key=r:1").text
    assert ids_on(page) == [seeded.keyed]
    assert ids_on(client.get("/queues/reports?key=nope").text) == []
    # by id: straight to the job
    r = client.get(f"/queues/mail?id={seeded.ready[0]}", follow_redirects=False)
    assert r.status_code == 303 and r.headers["location"] == f"/jobs/{seeded.ready[0]}"
    assert "No job with id nope" in client.get("/queues/mail?id=nope").text
    # by time (updated since/until)
    assert ids_on(client.get("/queues/mail?since=2000-01-01&until=2000-01-02").text) == []
    assert len(ids_on(client.get("/queues/mail?since=1h").text)) == 6
    assert "is neither a relative time" in client.get("/queues/mail?since=yesterday-ish").text


def test_key_search_finds_a_job_older_than_any_window(client: TestClient, seeded: Seeded) -> None:
    """The key search is exact over every stored job: thousands of newer jobs
    (more than the 2,000 the dashboard once looked through) do not hide it."""

    async def many(app: dw.App) -> None:
        await app.tasks["dashapp.report"].aenqueue_many([(f"w{i}",) for i in range(2500)])

    broker_call(seeded, many)
    assert ids_on(client.get("/queues/reports?key=r:1").text) == [seeded.keyed]
    assert ids_on(client.get("/queues/reports?key=r:1&state=ready&limit=20").text) == [seeded.keyed]
    assert ids_on(client.get("/queues/reports?key=r:1&state=dead").text) == []
    assert ids_on(client.get("/queues/reports?key=r:").text) == []
    assert ids_on(client.get("/queues/mail?key=r:1").text) == []


def test_queue_paging_with_cursors(client: TestClient, seeded: Seeded) -> None:
    async def many(app: dw.App) -> None:
        await app.tasks["dashapp.welcome"].aenqueue_many([(i,) for i in range(45)])

    broker_call(seeded, many)
    seen: list[str] = []
    url = "/queues/mail?state=ready&limit=20"
    pages = 0
    while url:
        page = client.get(url).text
        seen += ids_on(page)
        pages += 1
        m = re.search(r'href="([^"]+)" rel="next"', page)
        url = m.group(1).replace("&amp;", "&") if m else ""
        if url.startswith("?"):
            url = "/queues/mail" + url
    assert pages == 3
    assert len(seen) == 48 and len(set(seen)) == 48
    assert seen == sorted(seen, reverse=True)


def test_job_detail_shows_arguments_headers_and_attempts(
    client: TestClient, seeded: Seeded
) -> None:
    page = client.get(f"/jobs/{seeded.dead[0]}").text
    assert "dashapp.flaky" in page
    assert "u0@example.com" in page  # the arguments
    assert 'id="headers"' in page
    assert page.count('<details class="error"') == 2  # two attempts
    assert "ConnectionError" in page and "smtp down for u0@example.com" in page
    assert "Traceback (most recent call last)" in page
    assert 'id="replay"' in page  # a dead letter can be replayed from here
    ready = client.get(f"/jobs/{seeded.ready[0]}").text
    assert "Cancel" in ready and 'id="replay"' not in ready
    assert client.get("/jobs/00000000-0000-7000-8000-000000000000").status_code == 404


def test_job_detail_escapes_what_jobs_carry(client: TestClient, seeded: Seeded) -> None:
    async def nasty(app: dw.App) -> str:
        job = await app.tasks["dashapp.report"].aenqueue("<script>alert(1)</script>")
        return job.id

    job_id = broker_call(seeded, nasty)
    page = client.get(f"/jobs/{job_id}").text
    assert "<script>alert(1)</script>" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page


def test_dead_letters_filter(client: TestClient, seeded: Seeded) -> None:
    page = client.get("/dead").text
    assert set(ids_on(page)) == set(seeded.dead)
    assert set(ids_on(client.get("/dead?queue=mail&error=ConnectionError").text)) == set(
        seeded.dead
    )
    assert ids_on(client.get("/dead?error=TimeoutError").text) == []
    assert ids_on(client.get("/dead?task=dashapp.welcome").text) == []
    assert set(ids_on(client.get("/dead?task=flaky").text)) == set(seeded.dead)
    assert ids_on(client.get("/dead?queue=reports").text) == []


def test_replay_one_selected_or_all_matching(client: TestClient, seeded: Seeded) -> None:
    page = client.get("/dead").text
    token = csrf(page)
    one, two = seeded.dead
    r = client.post(
        "/actions/dead/replay",
        data={"csrf": token, "scope": "selected", "id": one, "next": "/dead"},
    )
    assert r.status_code == 200 and "replayed 1 dead letter" in r.text
    assert ids_on(r.text) == [two]
    # every dead letter needs all=1 when no filter narrows the selection
    r = client.post("/actions/dead/replay", data={"csrf": token, "scope": "matching"})
    assert "refusing to act on every dead letter" in r.text
    r = client.post(
        "/actions/dead/replay", data={"csrf": token, "scope": "matching", "queue": "mail"}
    )
    assert "replayed 1 dead letter" in r.text

    async def states(app: dw.App) -> list[State]:
        return [(await app.broker.get(i)).state for i in (one, two)]  # type: ignore[union-attr]

    assert broker_call(seeded, states) == [State.READY, State.READY]


def test_purge_selected_and_all(client: TestClient, seeded: Seeded) -> None:
    token = csrf(client.get("/dead").text)
    one, two = seeded.dead
    r = client.post("/actions/dead/purge", data={"csrf": token, "scope": "selected", "id": [one]})
    assert "purged 1 dead letter" in r.text
    r = client.post("/actions/dead/purge", data={"csrf": token, "scope": "matching", "all": "1"})
    assert "purged 1 dead letter" in r.text

    async def gone(app: dw.App) -> list[object]:
        return [await app.broker.get(i) for i in (one, two)]

    assert broker_call(seeded, gone) == [None, None]
    # purge never touches jobs that are not dead
    r = client.post(
        "/actions/dead/purge", data={"csrf": token, "scope": "selected", "id": seeded.ready[0]}
    )
    assert "purged 0 dead letters" in r.text


def test_cancel_and_pause(client: TestClient, seeded: Seeded) -> None:
    page = client.get(f"/jobs/{seeded.ready[0]}").text
    token = csrf(page)
    r = client.post(
        "/actions/job/cancel",
        data={"csrf": token, "id": seeded.ready[0], "next": f"/jobs/{seeded.ready[0]}"},
    )
    assert "cancelled 1 job" in r.text and 'id="job-state">cancelled<' in r.text
    r = client.post("/actions/job/cancel", data={"csrf": token, "id": seeded.ready[0]})
    assert f"not cancelled: {seeded.ready[0]}: already cancelled" in r.text
    r = client.post("/actions/queue/pause", data={"csrf": token, "queue": "mail"})
    assert "paused mail" in r.text and "Resume" in r.text
    assert "paused" in client.get("/").text
    r = client.post("/actions/queue/resume", data={"csrf": token, "queue": "mail"})
    assert "resumed mail" in r.text


def test_workers_page_lists_live_workers(client: TestClient, seeded: Seeded) -> None:
    assert "no live worker" in client.get("/workers").text

    async def announce(app: dw.App) -> None:
        info = {
            "id": "host:1:abcd",
            "queues": ["mail", "reports"],
            "concurrency": 8,
            "inflight": 3,
            "buffered": 1,
            "started_at": time.time() - 600,
            "heartbeat_at": time.time() - 2,
            "counts": {"succeeded": 1234, "retried": 5, "dead": 2, "rescued": 0},
            "stopping": False,
        }
        await app.broker.kv_set({"worker:host:1:abcd": orjson.dumps(info)}, ttl=30)

    broker_call(seeded, announce)
    star = create_app(create_dashapp(), sample=False)
    with TestClient(star, client=LOOPBACK) as c:
        page = c.get("/workers").text
    assert "host:1:abcd" in page and "1,234" in page and "(+1)" in page
    assert re.search(r">\s*3\s*\(\+1\)", page)  # in flight
    assert "ago" in page


def test_schedules_page_and_actions(client: TestClient, seeded: Seeded) -> None:
    page = client.get("/schedules").text
    assert "dashapp.nightly" in page and "every 5m" in page
    token = csrf(page)
    r = client.post("/actions/schedule/pause", data={"csrf": token, "name": "nightly"})
    assert "paused dashapp.nightly" in r.text and "Resume" in r.text
    r = client.post("/actions/schedule/resume", data={"csrf": token, "name": "dashapp.nightly"})
    assert "resumed dashapp.nightly" in r.text
    r = client.post("/actions/schedule/trigger", data={"csrf": token, "name": "dashapp.nightly"})
    m = re.search(r"triggered dashapp.nightly: job ([0-9a-f-]+)", r.text)
    assert m
    assert "dashapp.report" in client.get(f"/jobs/{m.group(1)}").text
    r = client.post("/actions/schedule/trigger", data={"csrf": token, "name": "nope"})
    assert "no schedule" in r.text


def test_schedules_page_without_a_scheduler(
    client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "dumbwaiter.scheduler", None)
    page = client.get("/schedules")
    assert page.status_code == 200 and "no scheduler" in page.text


def test_alerts_page_evaluate_and_show(client: TestClient, seeded: Seeded) -> None:
    page = client.get("/alerts").text
    assert "queue_depth" in page and "dead_letters" in page
    assert "No alert rules are configured" in page
    r = client.post("/actions/alerts/evaluate", data={"csrf": csrf(page)})
    assert "evaluated:" in r.text
    # lag of ready jobs is not over 5 min; nothing firing on a fresh broker
    assert "nothing firing" in r.text or "<td>lag</td>" in r.text


def test_metrics_endpoint_serves_the_gauges(client: TestClient) -> None:
    r = client.get("/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    assert 'dumbwaiter_queue_ready{queue="mail"} 3.0' in r.text
    assert 'dumbwaiter_queue_dead{queue="mail"} 2.0' in r.text
    assert 'dumbwaiter_queue_ready{queue="group:ledger"} 1.0' in r.text
    assert "dumbwaiter_scheduler_leader" not in r.text  # no scheduler has run


def test_static_assets_are_vendored(client: TestClient) -> None:
    r = client.get("/static/htmx.min.js")
    assert r.status_code == 200 and "htmx" in r.text[:200]
    assert client.get("/static/htmx.LICENSE").status_code == 200
    assert client.get("/static/dashboard.css").status_code == 200
    page = client.get("/").text
    assert "https://" not in page and "//cdn" not in page  # nothing loaded from elsewhere
    assert re.findall(r'<script src="([^"]+)"', page) == ["/static/htmx.min.js"]


def test_mounted_under_a_prefix(seeded: Seeded) -> None:
    from starlette.applications import Starlette
    from starlette.routing import Mount

    outer = Starlette(routes=[Mount("/ops/jobs", create_app(create_dashapp(), sample=False))])
    with TestClient(outer, client=LOOPBACK) as c:
        page = c.get("/ops/jobs/").text
        assert 'href="/ops/jobs/queues/mail"' in page
        assert 'src="/ops/jobs/static/htmx.min.js"' in page
        assert c.get("/ops/jobs/static/dashboard.css").status_code == 200
        token = csrf(c.get("/ops/jobs/queues/mail").text)
        r = c.post(
            "/ops/jobs/actions/queue/pause",
            data={"csrf": token, "queue": "mail", "next": "/ops/jobs/queues/mail"},
        )
        assert r.status_code == 200 and str(r.url).endswith("/ops/jobs/queues/mail?msg=paused+mail")


def test_replayed_dead_letter_runs(client: TestClient, seeded: Seeded) -> None:
    """The whole loop: fix the outage, replay from the page, a worker runs it."""
    seeded.flag.touch()
    token = csrf(client.get("/dead").text)
    client.post("/actions/dead/replay", data={"csrf": token, "scope": "matching", "all": "1"})

    async def work(app: dw.App) -> list[State]:
        from dumbwaiter.testing import drain

        await drain(app, ["mail"], scheduled=False)  # one welcome waits an hour
        return [(await app.broker.get(i)).state for i in seeded.dead]  # type: ignore[union-attr]

    assert broker_call(seeded, work) == [State.SUCCEEDED, State.SUCCEEDED]
    page = client.get(f"/jobs/{seeded.dead[0]}").text
    assert 'id="job-state">succeeded<' in page and "<dt>replays</dt><dd>1</dd>" in page
    assert JobFilter  # type: ignore[truthy-function]  # imported for readers: the actions use JobFilter(state=DEAD)


def test_a_foreign_body_shows_as_it_was_stored(client: TestClient, seeded: Seeded) -> None:
    """A job another program wrote with a body that is not an envelope (nor
    UTF-8) is a dead letter whose page shows the stored bytes, not
    replacement characters."""
    import sqlite3

    from dumbwaiter.message import uuid7
    from dumbwaiter.testing import drain

    jid, now = uuid7(), time.time()
    conn = sqlite3.connect(seeded.url.removeprefix("sqlite:///"))
    with conn:
        conn.execute(
            "INSERT INTO dw_jobs (id, queue, name, kind, state, run_at, updated_at,"
            " max_attempts, body) VALUES (?, 'mail', 'foreign.job', 'task', 'ready', ?, ?, 1, ?)",
            (jid, now, now, b"order \xff\xfe <b>42</b>"),
        )
        conn.execute("UPDATE dw_counts SET n = n + 1 WHERE queue = 'mail' AND state = 'ready'")
    conn.close()
    seeded.flag.touch()  # the mail server is up: only the foreign job fails
    broker_call(seeded, lambda app: drain(app, ["mail"], scheduled=False))
    assert jid in ids_on(client.get("/dead").text)
    page = client.get(f"/jobs/{jid}").text
    assert "MessageDecodeError" in page
    assert "not UTF-8" in page
    assert "order \\xff\\xfe &lt;b&gt;42&lt;/b&gt;" in page
