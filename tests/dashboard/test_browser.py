"""The dashboard in a real browser: Playwright driving Debian's Chromium
against uvicorn on 127.0.0.1, over a real SQLite broker and a real worker.

Locally the tests skip when /usr/bin/chromium is missing; in CI (CI=true)
they fail, as a broker test does without its server.  Playwright's own
browser download is never used (``executable_path``).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import require_service
from tests.dashboard.browser import have_chromium, launch, serve, worker_thread
from tests.dashboard.conftest import Seeded, in_thread
from tests.dashboard.dashapp import create_app as create_dashapp
from tests.waiting import wait_until

TOKEN = "correct-horse-battery-staple"
WAIT = 15_000  # ms: the longest any expectation waits for the page to change


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    require_service("chromium", have_chromium(), "/usr/bin/chromium is not installed")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = launch(p)
        yield b
        b.close()


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    context = browser.new_context()
    p = context.new_page()
    p.set_default_timeout(WAIT)
    yield p
    context.close()


def test_overview_shows_the_right_counts(seeded: Seeded, page: Any) -> None:
    from playwright.sync_api import expect

    with serve(create_dashapp()) as url:
        page.goto(url + "/")
        mail = page.locator('tr[data-queue="mail"]')
        expect(mail.locator('[data-col="ready"]')).to_have_text("3")
        expect(mail.locator('[data-col="scheduled"]')).to_have_text("1")
        expect(mail.locator('[data-col="dead"]')).to_have_text("2")
        expect(page.locator('tr[data-queue="reports"] [data-col="ready"]')).to_have_text("1")
        expect(page.locator('tr[data-queue="group:ledger"] [data-col="ready"]')).to_have_text("1")
        expect(page.locator("#total-ready")).to_have_text("5")
        expect(page.locator("svg.chart")).to_be_visible()
        # htmx is loaded from the package and running under the strict CSP
        assert page.evaluate("typeof htmx") == "object"
        # navigation is boosted: following a link keeps the page, swaps the body
        page.get_by_role("link", name="Dead letters").click()
        expect(page).to_have_url(url + "/dead")
        expect(page.locator("tr[data-id]")).to_have_count(2)


def test_replaying_a_dead_letter_from_the_page_makes_it_run(seeded: Seeded, page: Any) -> None:
    from playwright.sync_api import expect

    app = create_dashapp()
    with serve(create_dashapp()) as url, worker_thread(app, queues=("mail",)):
        job = seeded.dead[0]
        page.goto(f"{url}/jobs/{job}")
        expect(page.locator("#job-state")).to_have_text("dead")
        expect(page.locator("details.error")).to_have_count(2)
        seeded.flag.touch()  # the outage is over
        page.locator("#replay").click()
        expect(page.locator(".flash.ok")).to_have_text("replayed 1 dead letter")
        # the job page refreshes itself until the job is final: the worker ran it
        expect(page.locator("#job-state")).to_have_text("succeeded")
        expect(page.locator("dl.fields")).to_contain_text("replays")
        page.goto(url + "/dead")
        expect(page.locator("tr[data-id]")).to_have_count(1)
        # replay the other one by selecting it in the list
        page.locator(f'input[name="id"][value="{seeded.dead[1]}"]').check()
        page.locator("#replay-selected").click()
        expect(page.locator(".flash.ok")).to_have_text("replayed 1 dead letter")
        page.goto(f"{url}/jobs/{seeded.dead[1]}")
        expect(page.locator("#job-state")).to_have_text("succeeded")


def test_a_post_without_the_csrf_token_is_refused(seeded: Seeded, page: Any) -> None:
    from playwright.sync_api import expect

    with serve(create_dashapp()) as url:
        page.goto(url + "/queues/mail")  # the browser now holds the CSRF cookie
        # a request from this very session, without the token
        r = page.request.post(url + "/actions/queue/pause", form={"queue": "mail"})
        assert r.status == 403 and "CSRF" in r.text()
        # a cross-site form (another origin) posting into the dashboard
        page.set_content(
            f'<form id="evil" method="post" action="{url}/actions/dead/purge">'
            '<input name="scope" value="matching"><input name="all" value="1"></form>'
        )
        with page.expect_navigation():
            page.evaluate("document.getElementById('evil').submit()")
        expect(page.locator("body")).to_contain_text("403 Forbidden: missing or invalid CSRF")
        # nothing changed
        page.goto(url + "/dead")
        expect(page.locator("tr[data-id]")).to_have_count(2)
        page.goto(url + "/queues/mail")
        expect(page.locator("h1")).not_to_contain_text("paused")
        # the page's own form carries the token and works
        page.get_by_role("button", name="Pause").click()
        expect(page.locator(".flash.ok")).to_have_text("paused mail")


def test_an_unauthenticated_request_off_loopback_is_refused(seeded: Seeded, browser: Any) -> None:
    """Behind a reverse proxy on this host (which uvicorn trusts by default),
    the dashboard sees the real client: an outside address gets 403 without
    auth.  With a token, nobody gets in without it, and the login form works."""
    from playwright.sync_api import expect

    with serve(create_dashapp()) as url:
        outside = browser.new_context(extra_http_headers={"X-Forwarded-For": "203.0.113.9"})
        p = outside.new_page()
        r = p.goto(url + "/")
        assert r is not None and r.status == 403
        expect(p.locator("body")).to_contain_text("answers loopback clients only")
        assert p.goto(url + "/dead").status == 403
        outside.close()
    with serve(create_dashapp(), auth=_token()) as url:
        ctx = browser.new_context(extra_http_headers={"X-Forwarded-For": "203.0.113.9"})
        p = ctx.new_page()
        p.set_default_timeout(WAIT)
        r = p.goto(url + "/dead")
        assert r is not None and r.status == 401  # the sign-in form, as a styled 401
        p.locator('input[name="token"]').fill("not-the-token-at-all")
        p.get_by_role("button", name="Sign in").click()
        expect(p.locator(".flash.err")).to_contain_text("not right")
        p.locator('input[name="token"]').fill(TOKEN)
        p.get_by_role("button", name="Sign in").click()
        expect(p).to_have_url(url + "/dead")  # back where it was going
        expect(p.locator("tr[data-id]")).to_have_count(2)
        ctx.close()


def _token() -> Any:
    from dumbwaiter.dashboard import Auth

    return Auth(token=TOKEN)


def test_sign_in_then_a_job_page_and_the_events_page(
    seeded: Seeded, browser: Any, tmp_path: Path
) -> None:
    """Signed out, a deep link shows the sign-in form and nothing else; signed
    in, the job page names its arguments and times its attempts, and the
    events page shows the event, its payload and its group.  Screenshots go
    to $DW_SCREENSHOTS (default: the test's tmp dir) for a person to look at."""
    from playwright.sync_api import expect

    shots = Path(os.environ.get("DW_SCREENSHOTS") or tmp_path)
    shots.mkdir(parents=True, exist_ok=True)
    with serve(create_dashapp(), auth=_token()) as url:
        ctx = browser.new_context(viewport={"width": 1280, "height": 900})
        p = ctx.new_page()
        p.set_default_timeout(WAIT)
        job = seeded.dead[0]
        r = p.goto(f"{url}/jobs/{job}")
        assert r is not None and r.status == 401
        expect(p.locator("h1")).to_have_text("Sign in")
        body = p.locator("body").inner_text()
        for secret in ("sqlite", "mail", "dashapp", "Dead letters", job):
            assert secret not in body, secret
        p.screenshot(path=str(shots / "signin.png"))
        p.locator('input[name="token"]').fill(TOKEN)
        p.get_by_role("button", name="Sign in").click()
        expect(p).to_have_url(f"{url}/jobs/{job}")
        expect(p.locator("#job-state")).to_have_text("dead")
        expect(p.locator("#args tbody tr")).to_have_count(1)
        expect(p.locator("#args tbody tr td").first).to_have_text("to")
        expect(p.locator("#args")).to_contain_text('"u0@example.com"')
        expect(p.locator("details.error summary").last).to_contain_text(" ms")
        expect(p.locator("#took")).to_contain_text("ms")
        p.screenshot(path=str(shots / "job.png"), full_page=True)
        p.get_by_role("link", name="Events").click()
        expect(p).to_have_url(url + "/events")
        row = p.locator("#events tbody tr[data-event]")
        expect(row).to_have_count(1)
        expect(row.locator('[data-group="ledger"]')).to_contain_text("ready")
        row.locator("summary").click()  # the payload, whole
        expect(row.locator("pre.json")).to_contain_text('"order": "o-1"')
        p.screenshot(path=str(shots / "events.png"), full_page=True)
        ctx.close()


def test_a_workflow_run_page_signalled_from_the_browser(
    tmp_path: Path, page: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run waiting for an event: its page says so and offers the signal
    form; signalling it from the page wakes the run, a worker runs it to its
    end, and the page (which refreshes itself while the run is under way)
    shows it succeeded, with the event it got in the timeline."""
    from playwright.sync_api import expect

    from dumbwaiter.durable.api import workflows
    from dumbwaiter.testing import drain
    from tests.dashboard.wfapp import create_app as create_wfapp

    url = f"sqlite:///{tmp_path}/runs.db"
    monkeypatch.setenv("DASHWF_FLAG", str(tmp_path / "up"))

    async def start() -> Any:
        app = create_wfapp(url)
        run = await workflows(app)["shop.confirm"].aenqueue("o-9")
        await drain(app, scheduled=False)
        assert await run.astatus() == "waiting"
        await app.aclose()
        return run

    run = in_thread(start)
    worker_app = create_wfapp(url)
    with serve(create_wfapp(url)) as base, worker_thread(worker_app):
        page.goto(base + "/workflows")
        page.get_by_role("link", name=run.id).click()
        expect(page).to_have_url(f"{base}/workflows/{run.id}")
        expect(page.locator("#run-status")).to_have_text("waiting")
        expect(page.locator("#waiting")).to_contain_text("dashboard_wf.order_confirmed")
        expect(page.locator("#waiting-match")).to_have_text('order_id = "o-9"')
        page.locator('#signal-form textarea[name="payload"]').fill(
            '{"order_id": "o-9", "by": "the browser"}'
        )
        page.locator("#signal-run").click()
        expect(page.locator(".flash.ok")).to_have_text(f"signalled {run.id}")
        expect(page.locator("#run-status")).to_have_text("succeeded")
        expect(page.locator("#result")).to_contain_text("confirmed by the browser")
        expect(page.locator('tr[data-step="confirmation"]')).to_contain_text("the browser")


def test_the_webhooks_page_replays_an_endpoints_dead_deliveries(
    tmp_path: Path, browser: Any
) -> None:
    """The endpoints page over real deliveries (tests/dashboard/hooksapp.py): a
    disabled endpoint and an open breaker are shown as such; replaying an
    endpoint's dead delivery from its page (confirmed in the dialog) gets it
    to the receiver, with its webhook-id, by a real worker."""
    from playwright.sync_api import expect

    from tests.dashboard.hooksapp import create_app as create_hooksapp
    from tests.dashboard.hooksapp import seed
    from tests.webhooks.receiver import Receiver
    from tests.webhooks.receiver import serve as serve_receiver

    def delivered(app: Any) -> int:
        [health] = app.webhooks.health("ep_flaky")
        return int(health["delivered"])

    rec = Receiver()
    with serve_receiver(rec) as receiver:
        hooks = in_thread(lambda: seed(f"sqlite:///{tmp_path}/hooks.db", receiver))
        page = browser.new_page()
        page.set_default_timeout(WAIT)
        page.on("dialog", lambda dialog: dialog.accept())  # hx-confirm asks first
        worker_app = create_hooksapp(hooks.url)
        with serve(create_hooksapp(hooks.url)) as url, worker_thread(worker_app):
            page.goto(url + "/")
            page.locator("header nav").get_by_role("link", name="Webhooks").click()
            expect(page).to_have_url(url + "/webhooks")
            gone = page.locator('tr[data-endpoint="ep_gone"]')
            expect(gone.locator('[data-col="state"]')).to_contain_text("disabled")
            expect(gone.locator('[data-col="state"]')).to_contain_text("410 Gone")
            down = page.locator('tr[data-endpoint="ep_down"]')
            expect(down.locator('[data-col="breaker"]')).to_contain_text("open")
            expect(down.locator('[data-col="failure-rate"]')).to_have_text("100.0 %")
            flaky = page.locator('tr[data-endpoint="ep_flaky"]')
            expect(flaky.locator('[data-col="dead"]')).to_have_text("1")
            flaky.get_by_role("link", name="ep_flaky").click()
            expect(page).to_have_url(url + "/webhooks/ep_flaky")
            expect(page.locator("#dead-deliveries tr[data-id]")).to_have_count(1)
            page.get_by_role("button", name="Replay all 1 dead").click()
            expect(page.locator(".flash.ok")).to_have_text("replayed 1 dead delivery to ep_flaky")
            # the worker delivers it: the receiver answers its second try with 200
            wait_until(lambda: delivered(worker_app) == 1, "the replayed delivery", WAIT / 1000)
            page.reload()
            expect(page.locator("#endpoint-delivered")).to_have_text("1 in 1 h")
            expect(page.locator("#dead-deliveries tr[data-id]")).to_have_count(0)
        page.close()
    [webhook_id] = hooks.sent["ep_flaky"]
    assert [r.webhook_id for r in rec.on("/flaky/1")] == [webhook_id, webhook_id]
