"""The job page's arguments by name and its times (duration, next retry), and
the jobs list's search by argument values."""

from __future__ import annotations

import asyncio
import html
import re
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

import orjson
import pytest
from starlette.testclient import TestClient

import dumbwaiter as dw
from dumbwaiter.cli.output import timestamp, took
from dumbwaiter.dashboard import create_app
from dumbwaiter.state import State
from dumbwaiter.testing import drain
from tests.dashboard.conftest import LOOPBACK, Seeded, ids_on
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


async def _flaky_succeeds(app: dw.App) -> dw.brokers.types.JobInfo:
    """Run a ``flaky`` job to success (its flag says the mail server is up)."""
    job = await app.tasks["dashapp.flaky"].aenqueue("cy@example.com")
    await drain(app, ["mail"], scheduled=False)
    info = await app.broker.get(job.id)
    assert info is not None
    return info


def args_on(page: str) -> dict[str, object]:
    """The arguments table: name -> value (as JSON), defaults marked with a '~'."""
    out: dict[str, object] = {}
    body = re.search(r'<table class="args" id="args">(.*?)</table>', page, re.S)
    assert body, "no arguments table"
    for row in re.findall(r"<tr( class=\"[^\"]*\")?>(.*?)</tr>", body.group(1), re.S):
        cls, cells = row
        m = re.search(r'<td class="mono">([^<]*)', cells)
        v = re.search(r'<pre class="json">(.*?)</pre>', cells, re.S)
        if m and v:
            name = m.group(1).strip() + ("~" if "default" in cls else "")
            out[name] = orjson.loads(html.unescape(v.group(1)))
    return out


def field(page: str, dt: str) -> str:
    m = re.search(rf"<dt>{re.escape(dt)}</dt><dd[^>]*>([^<]*)</dd>", page)
    assert m, f"no {dt!r} field"
    return m.group(1).strip()


def test_arguments_beside_their_names(client: TestClient, seeded: Seeded) -> None:
    async def enqueue(app: dw.App) -> list[str]:
        invite = app.tasks["dashapp.invite"]
        a = await invite.aenqueue("ann@example.com", admin=True)
        b = await invite.aenqueue("bob@example.com", "ops")
        return [a.id, b.id]

    a, b = broker_call(enqueue)
    page = client.get(f"/jobs/{a}").text
    assert args_on(page) == {"email": "ann@example.com", "team~": "core", "admin": True}
    assert args_on(client.get(f"/jobs/{b}").text) == {
        "email": "bob@example.com",
        "team": "ops",
        "admin~": False,
    }
    # the welcome job of the seed, with the arguments it was given
    assert args_on(client.get(f"/jobs/{seeded.ready[1]}").text) == {"user": 1}
    # a dashboard from a bare broker URL knows no signature: positional, unnamed
    with TestClient(create_app(seeded.url, sample=False), client=LOOPBACK) as bare:
        page = bare.get(f"/jobs/{a}").text
    assert args_on(page) == {"#0": "ann@example.com", "admin": True}
    assert "positional arguments are shown without their names" in page


def test_arguments_that_no_longer_fit_are_shown_as_stored(
    client: TestClient, seeded: Seeded
) -> None:
    async def old_job(app: dw.App) -> str:
        from dumbwaiter.message import TASK, Message, uuid7

        # as an older deploy of the task sent it
        msg = Message(uuid7(), TASK, "dashapp.welcome", "mail", [1, 2], created_at=time.time())
        [job_id] = await app.broker.enqueue([msg])
        return job_id

    job_id = broker_call(old_job)
    page = client.get(f"/jobs/{job_id}").text
    assert "no longer fit the signature of dashapp.welcome" in page
    assert args_on(page) == {"#0": 1, "#1": 2}


def test_duration_of_a_finished_job_and_of_each_failed_attempt(
    client: TestClient, seeded: Seeded
) -> None:
    # a dead letter of the seed: each failed attempt says how long it ran
    page = client.get(f"/jobs/{seeded.dead[0]}").text
    assert len(re.findall(r", after \d+(\.\d)? ms</span></summary>", page)) == 2
    assert field(page, "last attempt took").endswith("ms")

    seeded.flag.touch()  # the mail server is up: flaky succeeds

    info = broker_call(_flaky_succeeds)
    assert info.state is State.SUCCEEDED
    done = info.outcome()
    assert done["started"] <= done["finished"]
    page = client.get(f"/jobs/{info.message.id}").text
    assert field(page, "took") == took(done["finished"] - done["started"])
    assert "started" in page and "finished" in page
    # the result is still shown, and only where the task keeps it (flaky does not)
    assert "<h2>Result</h2>" not in page


def test_next_retry_time_of_a_retrying_job(client: TestClient, seeded: Seeded) -> None:
    async def fail_once(app: dw.App) -> dw.brokers.types.JobInfo:
        job = await app.tasks["dashapp.sync_crm"].aenqueue(7)
        await drain(app, ["crm"], scheduled=False)
        info = await app.broker.get(job.id)
        assert info is not None
        return info

    info = broker_call(fail_once)
    assert info.state is State.RETRYING and info.run_at is not None
    page = client.get(f"/jobs/{info.message.id}").text
    shown = field(page, "next attempt")
    assert shown.startswith(timestamp(info.run_at))
    assert re.search(r"\(in (59m\d\ds|1h00m)\)$", shown), shown  # the 1 h backoff
    assert "TimeoutError" in page and re.search(r", after [\d.]+ ms</span>", page)


def test_a_running_job_shows_how_long_it_has_run(client: TestClient, seeded: Seeded) -> None:
    async def start(app: dw.App) -> str:
        await app.tasks["dashapp.invite"].aenqueue("dee@example.com")
        [d] = await app.broker.fetch(["invites"], 1, 60.0, 0)
        return d.id

    job_id = broker_call(start)
    page = client.get(f"/jobs/{job_id}").text
    assert 'id="job-state">running<' in page
    assert re.search(r"<dt>running for</dt><dd id=\"took\">[\d.]+ (ms|s)</dd>", page)
    assert "Cancel (ask it to stop)" in page


@pytest.fixture
def invites(seeded: Seeded) -> list[str]:
    """12 invites, newest last: every third one to example.org, one to team ops."""

    async def enqueue(app: dw.App) -> list[str]:
        invite = app.tasks["dashapp.invite"]
        ids = []
        for i in range(12):
            domain = "example.org" if i % 3 == 0 else "example.com"
            team = "ops" if i == 4 else "core"
            ids.append((await invite.aenqueue(f"user{i}@{domain}", team)).id)
        return ids

    return broker_call(enqueue)


def test_search_by_argument_values(client: TestClient, invites: list[str]) -> None:
    def found(query: str, extra: str = "") -> list[str]:
        params = {"args": query, "limit": "20", **_q(extra)}
        page = client.get("/queues/invites", params=params)
        assert page.status_code == 200
        return ids_on(page.text)

    org = [invites[i] for i in (9, 6, 3, 0)]
    assert found("example.org") == org  # text anywhere in the arguments, newest first
    assert found("EXAMPLE.ORG") == org
    assert found("email=user6@example.org") == [invites[6]]
    assert found('email="user6@example.org"') == [invites[6]]
    assert found("team=ops") == [invites[4]]  # by the parameter's name, positional or not
    assert found("team=core") == [i for i in reversed(invites) if i != invites[4]]
    assert found("nobody") == []
    assert found("example.org", "state=ready") == org
    assert found("example.org", "state=dead") == []
    page = client.get("/queues/invites", params={"args": "example.org"}).text
    assert "looked through 12 job(s)" in page and "to the end of this listing" in page


def test_search_reads_a_bounded_window_and_goes_on_from_it(
    client: TestClient, invites: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from dumbwaiter.dashboard import search

    monkeypatch.setattr(search, "SCAN_LIMIT", 5)
    page = client.get("/queues/invites", params={"args": "example.org"}).text
    # the 5 newest are 11..7: one match (9), and a link to go on
    assert ids_on(page) == [invites[9]]
    assert "looked through 5 job(s) (the most one search reads)" in page
    m = re.search(r'<a href="(\?[^"]+)">go on with older jobs</a>', page)
    assert m
    page = client.get("/queues/invites" + html.unescape(m.group(1))).text
    assert ids_on(page) == [invites[6], invites[3]]
    m = re.search(r'<a href="(\?[^"]+)">go on with older jobs</a>', page)
    assert m
    page = client.get("/queues/invites" + html.unescape(m.group(1))).text
    assert ids_on(page) == [invites[0]]
    assert "to the end of this listing" in page


def _q(extra: str) -> dict[str, str]:
    return dict(p.split("=", 1) for p in extra.split("&") if p)


def test_a_compact_record_is_listed_and_shown_without_its_arguments(
    client: TestClient, seeded: Seeded
) -> None:
    """A task without ``keep_result`` keeps a compact record once it succeeded
    (brokers/finished.py): the queue's listing still shows it, its page says
    what was not kept instead of an empty arguments table, and so does
    ``dumbwaiter jobs show``."""
    from click.testing import CliRunner

    from dumbwaiter.cli import main

    seeded.flag.touch()  # the mail server is up: flaky succeeds

    info = broker_call(_flaky_succeeds)
    assert info.state is State.SUCCEEDED and info.compact
    listed = client.get("/queues/mail", params={"state": "succeeded"})
    # the drain ran the seed's ready welcome jobs too: compact records all
    assert listed.status_code == 200
    assert set(ids_on(listed.text)) == {info.message.id, *seeded.ready}
    assert info.message.id in ids_on(client.get("/queues/mail").text)
    page = client.get(f"/jobs/{info.message.id}")
    assert page.status_code == 200 and 'id="compact"' in page.text
    assert 'id="args"' not in page.text

    shown = CliRunner().invoke(
        main, ["jobs", "show", info.message.id, "--url", seeded.url], catch_exceptions=False
    )
    assert shown.exit_code == 0 and "not kept once it succeeded" in shown.stdout
    listed_cli = CliRunner().invoke(
        main, ["jobs", "ls", "--state", "succeeded", "--url", seeded.url], catch_exceptions=False
    )
    assert listed_cli.exit_code == 0 and info.message.id[:8] in listed_cli.stdout
