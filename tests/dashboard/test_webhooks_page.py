"""The webhook endpoints pages over real deliveries (tests/dashboard/hooksapp.py):
what each endpoint's row says, one endpoint's dead deliveries, and the
actions (replay, enable, disable) with their CSRF check."""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from starlette.testclient import TestClient

from dumbwaiter.dashboard import create_app
from tests.dashboard.conftest import LOOPBACK, csrf, in_thread
from tests.dashboard.hooksapp import Hooks, deliver, seed
from tests.dashboard.hooksapp import create_app as create_hooksapp
from tests.webhooks.receiver import Receiver, serve


@pytest.fixture
def receiver() -> Iterator[tuple[Receiver, str]]:
    r = Receiver()
    with serve(r) as url:
        yield r, url


@pytest.fixture
def hooks(tmp_path: Path, receiver: tuple[Receiver, str]) -> Hooks:
    return in_thread(lambda: seed(f"sqlite:///{tmp_path}/hooks.db", receiver[1]))


@pytest.fixture
def client(hooks: Hooks) -> Iterator[TestClient]:
    with TestClient(create_app(create_hooksapp(hooks.url), sample=False), client=LOOPBACK) as c:
        yield c


def row(page_html: str, endpoint: str) -> str:
    m = re.search(rf'<tr data-endpoint="{endpoint}">(.*?)</tr>', page_html, re.S)
    assert m, f"no row for {endpoint}"
    return m.group(1)


def col(row_html: str, name: str) -> str:
    m = re.search(rf'data-col="{name}">(.*?)</td>', row_html, re.S)
    assert m, f"no {name} cell"
    return re.sub(r"<[^>]+>", "", m.group(1)).strip()


def test_the_endpoints_page_shows_health_failure_rate_disabled_and_dead(
    client: TestClient,
) -> None:
    page = client.get("/webhooks")
    assert page.status_code == 200
    html = page.text
    assert '<a href="/webhooks" aria-current="page">Webhooks</a>' in html  # in the nav
    assert "4 registered, 1 disabled, 1 with the breaker not closed, 4 dead deliveries" in html
    ok = row(html, "ep_ok")
    assert col(ok, "state") == "enabled" and col(ok, "breaker") == "closed"
    assert (col(ok, "delivered"), col(ok, "failed"), col(ok, "dead")) == ("1", "0", "0")
    assert col(ok, "failure-rate") == "0.0 %"
    assert "Replay dead" not in ok and "Enable" not in ok
    gone = row(html, "ep_gone")
    assert col(gone, "state").startswith("disabled 410 Gone at ")
    assert col(gone, "dead") == "1" and "Replay dead" in gone and "Enable" in gone
    down = row(html, "ep_down")
    assert col(down, "breaker").startswith("open 2 failures in a row, next probe in ")
    assert (col(down, "failed"), col(down, "failure-rate"), col(down, "dead")) == (
        "2",
        "100.0 %",
        "2",
    )
    assert col(row(html, "ep_flaky"), "dead") == "1"
    # the receiver's URL is shown with its path masked (it may carry a token)
    assert "/flaky/1" not in html
    # another window for the failure rate; an unknown one falls back to an hour
    assert "failure rate (15 min)" in client.get("/webhooks?minutes=15").text
    assert "failure rate (1 h)" in client.get("/webhooks?minutes=7").text


def test_an_endpoints_page_lists_its_dead_deliveries(client: TestClient, hooks: Hooks) -> None:
    html = client.get("/webhooks/ep_down").text
    rows = re.findall(r'<tr data-id="([^"]+)">(.*?)</tr>', html, re.S)
    assert len(rows) == 2
    for job_id, cells in rows:
        assert f'href="/jobs/{job_id}"' in cells and "dashhooks.paid" in cells
        assert "DeliveryFailed: HTTP 500 from endpoint ep_down" in cells
    assert {w for w in hooks.sent["ep_down"]} == {
        w for w in hooks.sent["ep_down"] if w in html
    }  # each webhook-id is listed
    assert 'id="endpoint-breaker"><span class="tag bad">open</span>' in html
    assert "Replay all 2 dead" in html and 'data-action="disable"' in html
    assert client.get("/webhooks/ep_nope").status_code == 404


def test_replaying_an_endpoints_dead_deliveries_delivers_them(
    client: TestClient, hooks: Hooks, receiver: tuple[Receiver, str]
) -> None:
    rec, _ = receiver
    token = csrf(client.get("/webhooks/ep_flaky").text)
    # without the token: refused, nothing replayed
    r = client.post("/actions/webhooks/replay", data={"endpoint": "ep_flaky", "scope": "all"})
    assert r.status_code == 403
    r = client.post(
        "/actions/webhooks/replay",
        data={"csrf": token, "endpoint": "ep_flaky", "scope": "selected"},
        follow_redirects=False,
    )
    assert "select+at+least+one+dead+delivery" in r.headers["location"]
    r = client.post(
        "/actions/webhooks/replay",
        data={"csrf": token, "endpoint": "ep_flaky", "scope": "all", "next": "/webhooks"},
        follow_redirects=False,
    )
    assert r.status_code == 303
    assert r.headers["location"] == "/webhooks?msg=replayed+1+dead+delivery+to+ep_flaky"
    in_thread(lambda: deliver(create_hooksapp(hooks.url)))
    [webhook_id] = hooks.sent["ep_flaky"]
    assert [q.webhook_id for q in rec.on("/flaky/1")] == [webhook_id, webhook_id]  # same id
    html = client.get("/webhooks").text
    assert col(row(html, "ep_flaky"), "dead") == "0"
    assert col(row(html, "ep_flaky"), "delivered") == "1"


def test_replaying_selected_dead_deliveries_replays_only_those(client: TestClient) -> None:
    html = client.get("/webhooks/ep_down").text
    first, second = re.findall(r'<tr data-id="([^"]+)">', html)
    r = client.post(
        "/actions/webhooks/replay",
        data={"csrf": csrf(html), "endpoint": "ep_down", "scope": "selected", "id": [second]},
    )
    assert "replayed 1 dead delivery to ep_down" in r.text
    assert re.findall(r'<tr data-id="([^"]+)">', r.text) == [first]


def test_enabling_and_disabling_an_endpoint(client: TestClient) -> None:
    token = csrf(client.get("/webhooks").text)
    r = client.post("/actions/webhooks/enable", data={"csrf": token, "endpoint": "ep_gone"})
    assert "enabled ep_gone" in r.text
    assert 'id="endpoint-state"><span class="tag ok">enabled</span>' in r.text
    # its dead delivery waits for a replay; replaying to a disabled endpoint warns
    assert "Replay all 1 dead" in r.text
    r = client.post(
        "/actions/webhooks/disable",
        data={"csrf": token, "endpoint": "ep_ok", "reason": "partner asked for a pause"},
    )
    assert "disabled ep_ok" in r.text and "partner asked for a pause" in r.text
    r = client.post(
        "/actions/webhooks/replay", data={"csrf": token, "endpoint": "ep_ok", "scope": "all"}
    )
    assert "replayed 0 dead deliveries to ep_ok" in r.text
    r = client.post("/actions/webhooks/enable", data={"csrf": token, "endpoint": "ep_nope"})
    assert "no webhook endpoint &#39;ep_nope&#39;" in r.text
    r = client.post("/actions/webhooks/enable", data={"csrf": token})
    assert "no endpoint given" in r.text


def test_the_page_without_endpoints(tmp_path: Path) -> None:
    app = create_hooksapp(f"sqlite:///{tmp_path}/none.db")
    with TestClient(create_app(app, sample=False), client=LOOPBACK) as c:
        html = c.get("/webhooks").text
    assert "no webhook endpoint is registered" in html
    assert "0 registered, 0 disabled" in html


#: a dashboard in a process where httpx is not installed (``import httpx`` fails)
WITHOUT_HTTPX = """
import re, sys
sys.modules["httpx"] = None
import dumbwaiter as dw
from starlette.testclient import TestClient
from dumbwaiter.dashboard import create_app

with TestClient(create_app(dw.App(sys.argv[1]), sample=False), client=("127.0.0.1", 1)) as c:
    print(c.get("/webhooks").text)
    dead = c.get("/dead")
    token = re.search(r'name="csrf" value="([0-9a-f]+)"', dead.text).group(1)
    r = c.post("/actions/webhooks/enable", data={"csrf": token, "endpoint": "ep_x"})
    print("STATUS", dead.status_code, r.status_code, r.url.path, "ACTION", r.text)
"""


def test_without_the_webhooks_extra_the_page_says_so(tmp_path: Path) -> None:
    """A dashboard installed without httpx: the Webhooks page names the extra
    to install, the rest of the dashboard works, and an action is refused."""
    out = subprocess.run(
        [sys.executable, "-c", WITHOUT_HTTPX, f"sqlite:///{tmp_path}/bare.db"],
        capture_output=True, text=True, timeout=60, check=True,
    ).stdout  # fmt: skip
    page, _, action = out.partition("STATUS")
    assert "Webhooks cannot be read here" in page and "dumbwaiter[webhooks]" in page
    assert action.startswith(" 200 200 /webhooks ACTION")
    assert "dumbwaiter[webhooks]" in action.partition("ACTION")[2]
