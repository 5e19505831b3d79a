"""The dashboard's guard: loopback without auth, token and basic auth, CSRF on
every POST, security headers, and no secret of a broker URL in pages or logs."""

from __future__ import annotations

import asyncio
import base64
import logging
import re
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from click.testing import CliRunner
from starlette.testclient import TestClient

import dumbwaiter as dw
from dumbwaiter.cli import main
from dumbwaiter.dashboard import Auth, create_app
from dumbwaiter.dashboard.security import is_loopback
from dumbwaiter.redact import mask_url, secrets_of
from tests.dashboard.conftest import LOOPBACK, Seeded, csrf
from tests.dashboard.dashapp import create_app as create_dashapp

TOKEN = "correct-horse-battery-staple"
PAGES = [
    "/",
    "/queues/mail",
    "/dead",
    "/workers",
    "/schedules",
    "/alerts",
    "/workflows",
    "/metrics",
]


def test_off_loopback_is_refused_without_auth(seeded: Seeded) -> None:
    star = create_app(create_dashapp(), sample=False)
    for client in [("203.0.113.7", 4000), ("10.1.2.3", 4000), ("testclient", 1)]:
        with TestClient(star, client=client) as c:
            for path in [*PAGES, "/static/htmx.min.js"]:
                r = c.get(path)
                assert r.status_code == 403, path
                assert "answers loopback clients only" in r.text
            assert c.post("/actions/queue/pause", data={"queue": "mail"}).status_code == 403
    for client in [("127.0.0.1", 1), ("127.8.9.10", 1), ("::1", 1)]:
        with TestClient(star, client=client) as c:
            assert c.get("/").status_code == 200, client


def test_is_loopback() -> None:
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert is_loopback("::ffff:127.0.0.1")
    assert not is_loopback("0.0.0.0") and not is_loopback("192.168.1.2")
    assert not is_loopback("::") and not is_loopback(None) and not is_loopback("example.com")


def test_token_auth(seeded: Seeded) -> None:
    star = create_app(create_dashapp(), auth=Auth(token=TOKEN), sample=False)
    with TestClient(star, client=("203.0.113.7", 4000)) as c:
        for path in PAGES:
            assert c.get(path).status_code == 401, path
        r = c.get("/", headers={"Accept": "text/html"})
        assert r.status_code == 401 and 'action="/login"' in r.text  # the sign-in form
        r = c.get("/", headers={"Authorization": "Bearer wrong-token-wrong-token"})
        assert r.status_code == 401
        assert c.get("/", headers={"Authorization": f"Bearer {TOKEN}"}).status_code == 200
        # the login form sets a session cookie (an HMAC, not the token)
        login = c.get("/login")
        assert login.status_code == 200
        r = c.post("/login", data={"csrf": csrf(login.text), "token": "nope", "next": "/"})
        assert r.status_code == 401 and "not right" in r.text
        r = c.post("/login", data={"csrf": csrf(login.text), "token": TOKEN, "next": "/dead"})
        assert r.status_code == 200 and str(r.url).endswith("/dead")
        assert TOKEN not in (c.cookies.get("dw_session") or "")
        assert c.get("/workers").status_code == 200
        # a login without the CSRF token is refused
        c.cookies.clear()
        assert c.post("/login", data={"token": TOKEN}).status_code == 403


def test_basic_auth(seeded: Seeded) -> None:
    star = create_app(create_dashapp(), auth=Auth.basic("ops:s3cret-pass"), sample=False)
    with TestClient(star, client=LOOPBACK) as c:
        r = c.get("/")
        assert r.status_code == 401 and r.headers["www-authenticate"].startswith("Basic")
        good = base64.b64encode(b"ops:s3cret-pass").decode()
        bad = base64.b64encode(b"ops:guess").decode()
        assert c.get("/", headers={"Authorization": f"Basic {bad}"}).status_code == 401
        assert c.get("/", headers={"Authorization": "Basic !!!"}).status_code == 401
        assert c.get("/", headers={"Authorization": f"Basic {good}"}).status_code == 200


def _deployment(seeded: Seeded) -> list[str]:
    """What a page may show only after sign-in: the broker, queues, tasks,
    events, the other pages."""
    return [
        seeded.url,
        "sqlite:",
        "dash.db",
        "mail",
        "reports",
        "ledger",
        "dashapp",
        "order_paid",
        "/dead",
        "/workers",
        "Dead letters",
    ]


@pytest.mark.parametrize("auth", [Auth(token=TOKEN), Auth.basic("ops:s3cret-pass")])
def test_the_sign_in_page_and_the_401_show_nothing_of_the_deployment(
    seeded: Seeded, auth: Auth
) -> None:
    star = create_app(create_dashapp(), auth=auth, sample=False)
    html = {"Accept": "text/html,application/xhtml+xml"}
    with TestClient(star, client=("203.0.113.7", 4000)) as c:
        denied = c.get("/queues/mail?state=dead", headers=html)
        login = c.get("/login", headers=html)
        assert denied.status_code == 401 and login.status_code == 200
        assert denied.headers["www-authenticate"].startswith(
            "Basic" if auth.scheme == "basic" else "Bearer"
        )
        for page in (denied.text, login.text):
            assert "<title>Sign in</title>" in page
            assert 'href="/static/dashboard.css"' in page  # styled, from the dashboard itself
            assert "<nav" not in page
            for secret in _deployment(seeded):
                assert secret not in page.replace('value="/queues/mail?state=dead"', ""), secret
        # the 401 form brings the user back where they were going
        assert 'name="next" value="/queues/mail?state=dead"' in denied.text
        fields = (
            {"token": "wrong-token-wrong-token"}
            if auth.scheme == "token"
            else {"username": "ops", "password": "guess"}
        )
        r = c.post("/login", data={"csrf": csrf(login.text), "next": "/dead", **fields})
        assert r.status_code == 401 and "not right" in r.text
        assert all(secret not in r.text for secret in _deployment(seeded)[:5])
        fields = (
            {"token": TOKEN}
            if auth.scheme == "token"
            else {"username": "ops", "password": "s3cret-pass"}
        )
        r = c.post("/login", data={"csrf": csrf(login.text), "next": "/dead", **fields})
        assert r.status_code == 200 and str(r.url).endswith("/dead")
        assert "s3cret-pass" not in (c.cookies.get("dw_session") or "")
        assert "Dead letters" in c.get("/workers", headers=html).text
    # scripts get one line, no page
    with TestClient(star, client=("203.0.113.7", 4000)) as c:
        r = c.get("/", headers={"Accept": "application/json"})
        assert r.status_code == 401 and r.text.startswith("401 Unauthorized")


def test_auth_settings_are_checked() -> None:
    with pytest.raises(ValueError, match="16 characters"):
        Auth(token="short")
    with pytest.raises(ValueError, match="USER:PASSWORD"):
        Auth.basic("nopassword")


def test_every_post_needs_the_csrf_token(client: TestClient, seeded: Seeded) -> None:
    posts = {
        "/actions/queue/pause": {"queue": "mail"},
        "/actions/queue/resume": {"queue": "mail"},
        "/actions/job/cancel": {"id": seeded.ready[0]},
        "/actions/dead/replay": {"scope": "selected", "id": seeded.dead[0]},
        "/actions/dead/purge": {"scope": "selected", "id": seeded.dead[0]},
        "/actions/schedule/pause": {"name": "dashapp.nightly"},
        "/actions/alerts/evaluate": {},
        "/actions/workflow/cancel": {"run": seeded.ready[0]},
        "/actions/workflow/retry": {"run": seeded.ready[0]},
        "/actions/workflow/signal": {"run": seeded.ready[0], "payload": "{}"},
    }
    for path, data in posts.items():
        r = client.post(path, data=data)
        assert r.status_code == 403 and "CSRF" in r.text, path
        r = client.post(path, data={**data, "csrf": "0" * 64})
        assert r.status_code == 403, path
    # nothing changed
    assert "paused" not in client.get("/queues/mail").text.split("<h1>")[1].split("</h1>")[0]
    assert len(re.findall(r'<tr data-id="', client.get("/dead").text)) == 2
    # a token from another session (another cookie) does not work either
    token = csrf(client.get("/dead").text)
    other = TestClient(client.app, client=LOOPBACK)
    r = other.post("/actions/queue/pause", data={"queue": "mail", "csrf": token})
    assert r.status_code == 403
    # the header form (htmx sends X-CSRF-Token) works
    r = client.post("/actions/queue/pause", data={"queue": "mail"}, headers={"X-CSRF-Token": token})
    assert r.status_code == 200 and "paused mail" in r.text
    # a POST from another site is refused even with the token
    r = client.post(
        "/actions/queue/resume",
        data={"queue": "mail", "csrf": token},
        headers={"Origin": "https://evil.example"},
    )
    assert r.status_code == 403


def test_state_changes_are_post_only(client: TestClient) -> None:
    for path in [
        "/actions/queue/pause",
        "/actions/dead/replay",
        "/actions/dead/purge",
        "/actions/workflow/cancel",
        "/actions/workflow/retry",
        "/actions/workflow/signal",
    ]:
        assert client.get(path).status_code == 405


def test_security_headers(client: TestClient) -> None:
    r = client.get("/")
    csp = r.headers["content-security-policy"]
    assert "script-src 'self'" in csp and "frame-ancestors 'none'" in csp
    assert "unsafe-inline" not in csp and "unsafe-eval" not in csp
    assert r.headers["x-frame-options"] == "DENY"
    assert r.headers["x-content-type-options"] == "nosniff"
    assert r.headers["cache-control"] == "no-store"
    cookie = r.headers["set-cookie"]
    assert "dw_csrf=" in cookie and "HttpOnly" in cookie and "SameSite=Strict" in cookie


def test_redirect_target_stays_inside_the_dashboard(client: TestClient) -> None:
    token = csrf(client.get("/dead").text)
    for evil in ["https://evil.example/x", "//evil.example/x", "/\\evil.example"]:
        r = client.post(
            "/actions/queue/pause",
            data={"csrf": token, "queue": "mail", "next": evil},
            follow_redirects=False,
        )
        assert r.status_code == 303 and r.headers["location"].startswith("/queues/mail"), evil


def test_mask_url() -> None:
    assert mask_url("postgresql://app:s3cret@db:5432/app") == "postgresql://app:***@db:5432/app"
    assert mask_url("redis://:tok3n@cache:6379/0") == "redis://:***@cache:6379/0"
    assert mask_url("redis://cache:6379/0?password=pw1") == "redis://cache:6379/0?password=***"
    assert mask_url("sqlite:///var/lib/jobs.db") == "sqlite:///var/lib/jobs.db"
    assert mask_url("postgresql://app@db/app") == "postgresql://app@db/app"  # no secret
    assert mask_url("https://hooks.example/services/T0/B0/XYZ", path=True) == (
        "https://hooks.example/***"
    )
    assert secrets_of("postgresql://app:s3cret@db/app?sslpassword=k3y") == ["s3cret", "k3y"]


def test_broker_secrets_never_appear(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A real PostgreSQL broker reached with a password in its URL (the test
    server trusts loopback, so any password connects): pages show it masked,
    and no log line carries it."""
    from tests.integration.postgres.server import postgres_url

    plain = postgres_url(tmp_path)
    parts = urlsplit(plain)
    secret = "pa55-w0rd-xyz"
    url = plain.replace(
        f"//{parts.netloc}", f"//{parts.username}:{secret}@{parts.hostname}:{parts.port}", 1
    )
    caplog.set_level(logging.DEBUG)

    async def seed() -> None:
        app = dw.App(url, retry=dw.Retry.never())

        @app.task(queue="mail")
        def fails() -> None:
            raise RuntimeError("x")

        await fails.aenqueue()
        from dumbwaiter.testing import drain

        await drain(app)
        await app.aclose()

    asyncio.run(seed())
    star = create_app(url, sample=False, alerts=True)
    with TestClient(star, client=LOOPBACK) as c:
        pages = [c.get(p).text for p in PAGES]
        assert "1" in pages[0]
        token = csrf(c.get("/dead").text)
        pages.append(c.post("/actions/alerts/evaluate", data={"csrf": token}).text)
        pages.append(
            c.post(
                "/actions/dead/replay", data={"csrf": token, "scope": "matching", "all": "1"}
            ).text
        )
    for text in pages:
        assert secret not in text
    assert f"{parts.username}:***@{parts.hostname}" in pages[0]
    assert secret not in caplog.text
    assert "replayed 1 dead letter" in pages[-1]


def test_a_user_name_without_a_password_is_shown(tmp_path: Path) -> None:
    """Only the password is a secret: the page names the account it uses."""
    from tests.integration.postgres.server import postgres_url

    url = postgres_url(tmp_path)
    parts = urlsplit(url)
    assert parts.username and not parts.password
    with TestClient(create_app(url, sample=False), client=LOOPBACK) as c:
        page = c.get("/").text
    assert f"{parts.scheme}://{parts.username}@{parts.hostname}" in page
    assert "***@" not in page


def test_cli_refuses_other_addresses_without_auth() -> None:
    r = CliRunner().invoke(main, ["dashboard", "--url", "memory://", "--host", "0.0.0.0"])
    assert r.exit_code == 2
    assert "refusing to serve the dashboard on 0.0.0.0 without authentication" in r.output
    r = CliRunner().invoke(
        main, ["dashboard", "--url", "memory://", "--host", "0.0.0.0", "--token", "short"]
    )
    assert r.exit_code == 2 and "16 characters" in r.output
    r = CliRunner().invoke(
        main,
        ["dashboard", "--url", "memory://", "--token", TOKEN, "--basic-auth", "a:b"],
    )
    assert r.exit_code == 2 and "not both" in r.output
