"""The workflow pages: the runs list, a run's page (timeline, waits) and the
cancel / retry / signal actions, through Starlette's TestClient on a real
SQLite broker, with the runs carried by a real worker (``drain``) of another
App, as another process would run them."""

from __future__ import annotations

import asyncio
import html
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient

import dumbwaiter as dw
from dumbwaiter.dashboard import Auth, create_app
from dumbwaiter.durable import admin
from dumbwaiter.testing import drain_sync
from tests.dashboard.conftest import LOOPBACK, csrf
from tests.dashboard.wfapp import create_app as create_wfapp

TOKEN = "correct-horse-battery-staple"


@dataclass
class Runs:
    url: str
    flag: Path
    ids: dict[str, str] = field(default_factory=dict)

    def run(self, fn: Any) -> Any:
        """``await fn(app)`` on an App of its own (a third process's view)."""

        async def go() -> Any:
            app = create_wfapp(self.url)
            try:
                return await fn(app)
            finally:
                await app.aclose()

        return asyncio.run(go())

    def describe(self, name: str) -> dict[str, Any]:
        return dict(self.run(lambda app: admin.describe(app, self.ids[name])))

    def drain(self) -> None:
        """Run what is due now (a sleeping run's wake-up is an hour away)."""
        app = create_wfapp(self.url)
        try:
            drain_sync(app, scheduled=False)
        finally:
            app.close()


@pytest.fixture
def runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Runs:
    """shop.order o-2 succeeded, then o-1 failed at "ship"; shop.fulfil o-3
    sleeping; shop.confirm o-4 and o-5 waiting for an event; shop.label o-6
    waiting for its child (a shop.fulfil run, sleeping)."""
    url = f"sqlite:///{tmp_path}/runs.db"
    flag = tmp_path / "carrier-up"
    monkeypatch.setenv("DASHWF_FLAG", str(flag))
    r = Runs(url, flag)
    app = create_wfapp(url)
    wf = {name.removeprefix("shop."): w for name, w in _workflows(app).items()}
    try:
        flag.touch()
        r.ids["done"] = wf["order"].enqueue("o-2", 990).id
        r.drain()
        flag.unlink()
        r.ids["failed"] = wf["order"].enqueue("o-1", 1250).id
        r.drain()
        r.ids["sleeping"] = wf["fulfil"].enqueue("o-3").id
        r.ids["waiting"] = wf["confirm"].enqueue("o-4").id
        r.ids["doomed"] = wf["confirm"].enqueue("o-5").id
        r.ids["parent"] = wf["label"].enqueue("o-6").id
        r.drain()
    finally:
        app.close()
    child = r.describe("parent")["waiting"]["run"]
    r.ids["child"] = child
    return r


def _workflows(app: dw.App) -> dict[str, Any]:
    from dumbwaiter.durable.api import workflows

    return workflows(app)


@pytest.fixture
def client(runs: Runs) -> Iterator[TestClient]:
    with TestClient(create_app(create_wfapp(runs.url), sample=False), client=LOOPBACK) as c:
        yield c


def shown(client: TestClient, what: str, value: float) -> str:
    """``value`` as the page writes it (the dashboard's own filters: ``ts``
    for a time, ``took`` for a duration)."""
    return str(client.app.state.dw.templates.env.filters[what](value))  # type: ignore[attr-defined]


def run_ids(page: str) -> list[str]:
    return re.findall(r'<tr data-run="([^"]+)"', page)


def rows(page: str) -> dict[str, str]:
    """The timeline's rows by step name: their HTML."""
    found = re.findall(r'(<tr data-step="([^"]*)" data-kind="[^"]*".*?</tr>)', page, re.S)
    return {name: text for text, name in found}


def status_of(page: str) -> str:
    m = re.search(r'id="run-status">([^<]+)<', page)
    assert m, "no status on the page"
    return m.group(1)


def flash(page: str) -> str:
    m = re.search(r'<p class="flash (?:ok|err)" role="(?:status|alert)">([^<]*)</p>', page)
    return html.unescape(m.group(1)) if m else ""


def test_runs_list_newest_first_by_status_and_workflow(client: TestClient, runs: Runs) -> None:
    ids = runs.ids
    page = client.get("/workflows").text
    assert 'href="/workflows" aria-current="page">Workflows</a>' in page  # the nav link
    listed = run_ids(page)
    assert set(listed) == set(ids.values())
    # newest first: o-2 ran before o-1, which ran before the rest
    later = {ids[k] for k in ("sleeping", "waiting", "doomed", "parent", "child")}
    assert listed[-2:] == [ids["failed"], ids["done"]] and set(listed[:-2]) == later
    assert run_ids(client.get("/workflows?status=failed").text) == [ids["failed"]]
    assert set(run_ids(client.get("/workflows?status=sleeping").text)) == {
        ids["sleeping"],
        ids["child"],
    }
    waiting = client.get("/workflows?status=waiting").text
    assert set(run_ids(waiting)) == {ids["waiting"], ids["doomed"], ids["parent"]}
    assert "event dashboard_wf.order_confirmed (order_id=&#39;o-4&#39;)" in waiting
    assert f"child run {ids['child']}" in waiting
    by_name = {ids["waiting"], ids["doomed"]}
    assert set(run_ids(client.get("/workflows?workflow=shop.confirm").text)) == by_name
    assert set(run_ids(client.get("/workflows?workflow=confirm").text)) == by_name  # short name
    assert run_ids(client.get("/workflows?workflow=shop.nope").text) == []
    page = client.get("/workflows?status=failed").text
    assert "ConnectionError: carrier down: no pickup for o-1" in page
    assert "unknown status &#39;bogus&#39;" in client.get("/workflows?status=bogus").text
    # a run id typed in the box goes to its page
    r = client.get(f"/workflows?id={ids['failed']}", follow_redirects=False)
    assert r.status_code == 303 and r.headers["location"] == f"/workflows/{ids['failed']}"


def test_runs_list_shows_at_most_a_page(client: TestClient, runs: Runs) -> None:
    app = create_wfapp(runs.url)
    try:
        noop = _workflows(app)["shop.noop"]
        for i in range(21):
            noop.enqueue(i)
        drain_sync(app, scheduled=False)
    finally:
        app.close()
    assert len(run_ids(client.get("/workflows?limit=20").text)) == 20
    assert len(run_ids(client.get("/workflows?workflow=noop&limit=50").text)) == 21


def test_run_page_shows_steps_durations_outputs_and_the_error(
    client: TestClient, runs: Runs
) -> None:
    run = runs.ids["failed"]
    page = client.get(f"/workflows/{run}").text
    assert status_of(page) == "failed"
    found = rows(page)
    assert list(found) == ["charge", "reserve", "ship"]
    assert ">done<" in found["charge"] and ">done<" in found["reserve"]
    assert ">failed<" in found["ship"]
    # the outputs, as checkpointed
    assert "{&#34;id&#34;:&#34;ch-o-1&#34;,&#34;cents&#34;:1250" in found["charge"]
    assert "[&#34;o-1/sku-1&#34;,&#34;o-1/sku-2&#34;]" in found["reserve"]
    # the failed step's error, with its traceback; the run's error names the step
    assert "ConnectionError" in found["ship"] and "carrier down: no pickup for o-1" in found["ship"]
    assert 'class="traceback"' in found["ship"] and "in ship" in found["ship"]
    assert re.search(r'id="run-error">\s*<summary><strong>ConnectionError</strong>', page)
    assert "at step ship" in page
    # each step's duration, as recorded
    for step in runs.describe("failed")["steps"]:
        assert step["duration"] is not None
        cell = re.search(r'data-col="took">([^<]*)<', found[step["name"]])
        assert cell and cell.group(1) == shown(client, "took", step["duration"]), step["name"]
    # the inputs, by the workflow's parameter names
    inputs = re.search(r'id="inputs">(.*?)</table>', page, re.S)
    assert inputs
    cells = r'<td class="mono">(\w+)</td><td><pre class="json">([^<]*)</pre>'
    assert re.findall(cells, inputs.group(1)) == [("order_id", "&#34;o-1&#34;"), ("cents", "1250")]
    # what it offers
    assert 'id="retry-run"' in page and 'id="cancel-run"' not in page
    assert 'hx-trigger="every 2s"' not in page  # a finished run does not refresh itself
    # its first job's page links back to the run
    job = client.get(f"/jobs/{run}").text
    assert f'id="workflow-run" href="/workflows/{run}"' in job
    # a succeeded run shows its result
    done = client.get(f"/workflows/{runs.ids['done']}").text
    assert status_of(done) == "succeeded"
    assert "&#34;parcel&#34;: &#34;parcel-o-2&#34;" in done
    assert 'id="retry-run"' not in done and 'id="cancel-run"' not in done


def test_run_page_of_a_sleeping_run_says_until_when(client: TestClient, runs: Runs) -> None:
    page = client.get(f"/workflows/{runs.ids['sleeping']}").text
    wake = runs.describe("sleeping")["wake_at"]
    assert status_of(page) == "sleeping"
    box = re.search(r'id="waiting">(.*?)</div>', page, re.S)
    assert box, "no waiting box"
    text = re.sub(r"<[^>]+>", "", box.group(1))
    assert "the sleep cool-off to end: wakes " + shown(client, "ts", wake) in " ".join(text.split())
    found = rows(page)
    assert list(found) == ["pack", "cool-off"]
    assert (
        ">sleeping<" in found["cool-off"]
        and f"until {shown(client, 'ts', wake)}" in found["cool-off"]
    )
    assert "box for o-3" in found["pack"]
    assert 'id="cancel-run"' in page and 'id="retry-run"' not in page
    assert 'id="signal-form"' not in page  # a sleep takes no signal
    assert 'hx-trigger="every 2s"' not in page  # parked: nothing to refresh for


def test_run_page_of_a_run_waiting_for_an_event_or_a_child(client: TestClient, runs: Runs) -> None:
    info = runs.describe("waiting")
    page = client.get(f"/workflows/{runs.ids['waiting']}").text
    assert status_of(page) == "waiting"
    box = re.search(r'id="waiting">(.*?)</div>', page, re.S)
    assert box
    text = " ".join(re.sub(r"<[^>]+>", "", html.unescape(box.group(1))).split())
    assert 'an event dashboard_wf.order_confirmed matching order_id = "o-4"' in text
    assert "at confirmation; times out " + shown(client, "ts", info["wake_at"]) in text
    # the signal form, filled with what the wait matches
    assert (
        'id="signal-form"' in page
        and '<input type="hidden" name="step" value="confirmation">' in page
    )
    assert "{&#34;order_id&#34;:&#34;o-4&#34;}</textarea>" in page
    found = rows(page)
    assert list(found) == ["ask", "confirmation"]
    assert 'data-kind="waiting"' in page and ">waiting<" in found["confirmation"]
    assert "asked about o-4" in found["ask"]
    # a parent waiting for its child links to it, and the child to its parent
    parent = client.get(f"/workflows/{runs.ids['parent']}").text
    child = runs.ids["child"]
    assert status_of(parent) == "waiting"
    assert f'the child run <a class="mono" href="/workflows/{child}">{child}</a> (shop.fulfil)' in (
        parent
    )
    assert 'id="signal-form"' not in parent
    kid = client.get(f"/workflows/{child}").text
    assert status_of(kid) == "sleeping"
    assert f'href="/workflows/{runs.ids["parent"]}">{runs.ids["parent"]}</a>' in kid


def test_a_dashboard_without_the_workflow_code(runs: Runs) -> None:
    """From a bare broker URL (``dumbwaiter dashboard --url``): the same runs
    and timelines; inputs by position, as stored."""
    with TestClient(create_app(runs.url, sample=False), client=LOOPBACK) as c:
        assert set(run_ids(c.get("/workflows").text)) == set(runs.ids.values())
        page = c.get(f"/workflows/{runs.ids['failed']}").text
        assert status_of(page) == "failed" and list(rows(page)) == ["charge", "reserve", "ship"]
        assert "This app does not register shop.order" in page
        inputs = re.search(r'id="inputs">(.*?)</table>', page, re.S)
        assert inputs and re.findall(r'<td class="mono">(#\d)</td>', inputs.group(1)) == [
            "#0",
            "#1",
        ]


def test_unknown_run(client: TestClient) -> None:
    r = client.get("/workflows/0190aaaa-0000-7000-8000-000000000000")
    assert r.status_code == 404 and "no workflow run 0190aaaa" in r.text


def test_signal_cancel_and_retry_from_the_page(client: TestClient, runs: Runs) -> None:
    ids = runs.ids
    page = client.get(f"/workflows/{ids['waiting']}").text
    token = csrf(page)
    here = f"/workflows/{ids['waiting']}"

    def post(action: str, **data: str) -> str:
        r = client.post(f"/actions/workflow/{action}", data={"csrf": token, **data})
        assert r.status_code == 200, r.text
        return r.text

    # signal: refused with the reason for bad JSON, a payload that is not the
    # event, the wrong step, a run that waits for no event
    out = post("signal", run=ids["waiting"], payload="{nope", next=here)
    assert flash(out).startswith("the payload is not JSON")
    out = post("signal", run=ids["waiting"], payload='{"by": "ops"}', next=here)
    assert "is not a valid dashboard_wf.order_confirmed" in flash(out)
    out = post("signal", run=ids["waiting"], payload='{"order_id": "o-4"}', step="other")
    assert "waits at 'confirmation', not at 'other'" in flash(out)
    out = post("signal", run=ids["sleeping"], payload='{"order_id": "o-3"}')
    assert "waits for no event" in flash(out)
    assert status_of(client.get(here).text) == "waiting"
    out = post(
        "signal",
        run=ids["waiting"],
        payload='{"order_id": "o-4", "by": "ops"}',
        step="confirmation",
        next=here,
    )
    assert flash(out) == f"signalled {ids['waiting']}" and status_of(out) == "running"
    assert 'hx-trigger="every 2s"' in out  # on its way again: the page refreshes itself

    # cancel: once
    doomed = f"/workflows/{ids['doomed']}"
    out = post("cancel", run=ids["doomed"], next=doomed)
    assert flash(out) == f"cancelled {ids['doomed']}" and status_of(out) == "cancelled"
    assert 'id="cancel-run"' not in out
    out = post("cancel", run=ids["doomed"], next=doomed)
    assert flash(out) == f"{ids['doomed']} was not cancelled: it is cancelled"

    # retry: a succeeded run is refused; the failed one resumes at "ship"
    out = post("retry", run=ids["done"])
    assert "only a failed run can be retried" in flash(out)
    runs.flag.touch()  # the carrier is back
    out = post("retry", run=ids["failed"], next=f"/workflows/{ids['failed']}")
    assert flash(out) == f"resumed {ids['failed']}" and status_of(out) == "running"

    runs.drain()
    page = client.get(here).text
    assert status_of(page) == "succeeded" and "confirmed by ops" in page
    assert "&#34;by&#34;:&#34;ops&#34;" in rows(page)["confirmation"]  # the event it got
    assert ">done<" in rows(page)["confirmation"]
    page = client.get(f"/workflows/{ids['failed']}").text
    assert status_of(page) == "succeeded" and "parcel-o-1" in rows(page)["ship"]
    assert "Earlier failures" in page and "carrier down: no pickup for o-1" in page
    assert status_of(client.get(doomed).text) == "cancelled"
    assert runs.run(lambda app: admin.status(app, ids["doomed"])) == "cancelled"


def _untouched(runs: Runs) -> None:
    statuses = {k: runs.describe(k)["status"] for k in ("waiting", "doomed", "failed")}
    assert statuses == {"waiting": "waiting", "doomed": "waiting", "failed": "failed"}


ACTIONS = {
    "cancel": {"run": "doomed"},
    "retry": {"run": "failed"},
    "signal": {"run": "waiting", "payload": '{"order_id": "o-4"}'},
}


def _form(runs: Runs, data: dict[str, str]) -> dict[str, str]:
    return {k: runs.ids[v] if k == "run" else v for k, v in data.items()}


def test_workflow_actions_need_the_csrf_token(client: TestClient, runs: Runs) -> None:
    runs.flag.touch()  # a retry that got through would succeed
    token = csrf(client.get(f"/workflows/{runs.ids['waiting']}").text)
    for action, data in ACTIONS.items():
        path = f"/actions/workflow/{action}"
        form = _form(runs, data)
        r = client.post(path, data=form)
        assert r.status_code == 403 and "CSRF" in r.text, action
        assert client.post(path, data={**form, "csrf": "0" * 64}).status_code == 403, action
        # another site's form, even with the token
        r = client.post(
            path, data={**form, "csrf": token}, headers={"Origin": "https://evil.example"}
        )
        assert r.status_code == 403, action
        # another session's token (another cookie)
        other = TestClient(client.app, client=LOOPBACK)
        assert other.post(path, data={**form, "csrf": token}).status_code == 403, action
        assert client.get(path).status_code == 405  # never by GET
    _untouched(runs)


def test_workflow_pages_and_actions_need_auth(runs: Runs) -> None:
    runs.flag.touch()
    star = create_app(create_wfapp(runs.url), auth=Auth(token=TOKEN), sample=False)
    paths = ["/workflows", f"/workflows/{runs.ids['failed']}"]
    with TestClient(star, client=LOOPBACK) as c:
        token = csrf(c.get("/login").text)  # a CSRF cookie and its token, signed out
        for path in paths:
            r = c.get(path)
            assert r.status_code == 401, path
            assert runs.ids["failed"] not in r.text and "shop.order" not in r.text
        for action, data in ACTIONS.items():
            r = c.post(f"/actions/workflow/{action}", data={**_form(runs, data), "csrf": token})
            assert r.status_code == 401, action
        _untouched(runs)
        bearer = {"Authorization": f"Bearer {TOKEN}"}
        assert all(c.get(p, headers=bearer).status_code == 200 for p in paths)
        r = c.post(
            "/actions/workflow/cancel",
            data={"run": runs.ids["doomed"], "csrf": token},
            headers=bearer,
        )
        assert r.status_code == 200 and flash(r.text) == f"cancelled {runs.ids['doomed']}"
    # no auth configured: loopback only
    star = create_app(create_wfapp(runs.url), sample=False)
    with TestClient(star, client=("203.0.113.7", 4000)) as c:
        assert all(c.get(p).status_code == 403 for p in paths)
        r = c.post("/actions/workflow/retry", data={"run": runs.ids["failed"]})
        assert r.status_code == 403
    assert runs.describe("failed")["status"] == "failed"
