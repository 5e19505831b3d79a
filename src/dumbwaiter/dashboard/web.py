"""The dashboard's ASGI app: routes, shared state, rendering helpers.

Pages are rendered on the server (Jinja2, autoescaped) and enhanced with
htmx (vendored under static/, no CDN, no build step): links and forms are
"boosted" (fetched and swapped without a full reload), the overview
refreshes its tables every few seconds, and destructive actions ask for
confirmation.  Every page also works without JavaScript.

Reads go through one ``StatsCache`` (stats and workers, refreshed at most
every ``refresh`` seconds, however many tabs poll) and paged ``list_jobs``
calls (queries.py); nothing scans every job per request.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets as _secrets
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import jinja2
import orjson
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.templating import Jinja2Templates

from ..app import App
from ..cli.output import duration, relative, timestamp, took
from ..metrics import SCHEDULER_SLACK, StatsCache
from ..redact import mask_url
from .security import Auth, Guard, SignIn

log = logging.getLogger("dumbwaiter.dashboard")

HERE = Path(__file__).parent
PAGE_SIZES = (20, 50, 100, 200)
DEFAULT_PAGE = 50


@dataclass(slots=True)
class Dashboard:
    """Everything the handlers share (``request.app.state.dw``)."""

    app: App
    cache: StatsCache
    secret: bytes
    auth: Auth | None
    templates: Jinja2Templates
    #: run the app's alert rules in this process
    alerts: bool = False
    #: the sampler and alert tasks started by the lifespan
    tasks: list[asyncio.Task[None]] = field(default_factory=list)
    registry: Any = None

    @property
    def broker(self) -> Any:
        return self.app.broker

    @property
    def url(self) -> str:
        return mask_url(self.app.url)


def create_app(
    app: App | str,
    *,
    auth: Auth | None = None,
    secret: str | bytes | None = None,
    refresh: float = 2.0,
    alerts: bool = False,
    sample: bool = True,
) -> Starlette:
    """The dashboard of ``app`` (an App, or a broker URL for a code-less view).

    ``auth``: required to serve anything but loopback clients.  ``secret``
    signs the CSRF and session cookies (default ``$DUMBWAITER_DASHBOARD_SECRET``,
    else random per process; give one when several processes serve the same
    users).  ``refresh``: seconds stats are reused.  ``alerts``: evaluate the
    app's alert rules in this process.  ``sample``: keep stats and throughput
    samples fresh in the background (when run by an ASGI server that runs
    the lifespan; a mounted dashboard refreshes on requests)."""
    the_app = app if isinstance(app, App) else App(app)
    key = secret or os.environ.get("DUMBWAITER_DASHBOARD_SECRET") or _secrets.token_bytes(32)
    key_bytes = key.encode() if isinstance(key, str) else key
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(HERE / "templates")),
        autoescape=jinja2.select_autoescape(default=True, default_for_string=True),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters.update(
        ts=timestamp,
        ago=lambda t: relative(t) if t else "-",
        dur=duration,
        took=took,
        num=lambda n: f"{int(n):,}",
        pretty=lambda v: orjson.dumps(v, option=orjson.OPT_INDENT_2).decode(),
        compact=lambda v: orjson.dumps(v).decode(),
        iso=lambda t: datetime.fromtimestamp(t, UTC).isoformat(),
    )
    dw = Dashboard(
        app=the_app,
        cache=StatsCache(the_app.broker, refresh),
        secret=key_bytes,
        auth=auth if auth is not None and auth.configured else None,
        templates=Jinja2Templates(env=env),
        alerts=alerts,
    )

    from . import actions, pages, webhooks

    routes = [
        Route("/", pages.overview, name="overview"),
        Route("/queues/{queue:path}", pages.queue, name="queue"),
        Route("/jobs/{id}", pages.job, name="job"),
        Route("/dead", pages.dead, name="dead"),
        Route("/workers", pages.workers, name="workers"),
        Route("/schedules", pages.schedules, name="schedules"),
        Route("/events", pages.events, name="events"),
        Route("/alerts", pages.alerts, name="alerts"),
        Route("/workflows", pages.workflows, name="workflows"),
        Route("/workflows/{run}", pages.workflow_run, name="workflow_run"),
        Route("/webhooks", webhooks.endpoints, name="webhooks"),
        Route("/webhooks/{id}", webhooks.endpoint, name="webhook"),
        Route("/metrics", pages.metrics, name="metrics"),
        Route("/login", pages.login, methods=["GET"], name="login"),
        Route("/login", actions.login, methods=["POST"]),
        Route("/actions/queue/pause", actions.queue_pause, methods=["POST"]),
        Route("/actions/queue/resume", actions.queue_resume, methods=["POST"]),
        Route("/actions/queue/retry", actions.queue_retry, methods=["POST"]),
        Route("/actions/queue/delete", actions.queue_delete, methods=["POST"]),
        Route("/actions/job/cancel", actions.job_cancel, methods=["POST"]),
        Route("/actions/dead/replay", actions.dead_replay, methods=["POST"]),
        Route("/actions/dead/purge", actions.dead_purge, methods=["POST"]),
        Route("/actions/schedule/{verb}", actions.schedule, methods=["POST"]),
        Route("/actions/alerts/evaluate", actions.alerts_evaluate, methods=["POST"]),
        Route("/actions/workflow/cancel", actions.workflow_cancel, methods=["POST"]),
        Route("/actions/workflow/retry", actions.workflow_retry, methods=["POST"]),
        Route("/actions/workflow/signal", actions.workflow_signal, methods=["POST"]),
        Route("/actions/webhooks/replay", webhooks.replay, methods=["POST"]),
        Route("/actions/webhooks/enable", webhooks.enable, methods=["POST"]),
        Route("/actions/webhooks/disable", webhooks.disable, methods=["POST"]),
        Mount("/static", StaticFiles(directory=str(HERE / "static")), name="static"),
    ]

    @contextlib.asynccontextmanager
    async def lifespan(_app: Starlette) -> AsyncIterator[None]:
        if sample:
            dw.tasks.append(asyncio.create_task(dw.cache.run(), name="dashboard-sampler"))
        if alerts:
            from ..alerts import AlertService, effective_config

            service = AlertService(the_app, effective_config(the_app), cache=dw.cache)
            dw.tasks.append(asyncio.create_task(service.run(), name="dashboard-alerts"))
        log.info("dashboard for %s", dw.url)
        try:
            yield
        finally:
            for t in dw.tasks:
                t.cancel()
            await asyncio.gather(*dw.tasks, return_exceptions=True)
            dw.tasks.clear()
            await the_app.broker.close()

    star = Starlette(routes=routes, lifespan=lifespan)
    star.state.dw = dw
    star.add_middleware(Guard, auth=dw.auth, secret=key_bytes, signin=_signin(env))
    return star


def _signin(env: jinja2.Environment) -> SignIn:
    """The sign-in page: its own template, given nothing of the deployment."""
    template = env.get_template("signin.html")

    def page(base: str, csrf: str, scheme: str, nxt: str, failed: bool) -> str:
        return template.render(
            base=base, csrf=csrf, scheme=scheme, next=nxt, failed=failed, status=401
        )

    return page


def render_signin(
    request: Request, *, failed: bool, status_code: int, nxt: str | None = None
) -> Response:
    """The sign-in page (GET /login, a failed sign-in)."""
    dw = state(request)
    assert dw.auth is not None
    if nxt is None:
        nxt = str(request.query_params.get("next", ""))
    page = dw.templates.env.get_template("signin.html").render(
        base=base(request),
        csrf=request.state.csrf,
        scheme=dw.auth.scheme,
        next=nxt,
        failed=failed,
        status=status_code,
    )
    return HTMLResponse(page, status_code=status_code)


# -- helpers for the handlers ----------------------------------------------------------


def state(request: Request) -> Dashboard:
    dw: Dashboard = request.app.state.dw
    return dw


def base(request: Request) -> str:
    return str(request.scope.get("root_path", ""))


def render(
    request: Request, name: str, context: dict[str, Any], status_code: int = 200
) -> Response:
    dw = state(request)
    ctx = {
        "request": request,
        "base": base(request),
        "csrf": request.state.csrf,
        "app_url": dw.url,
        "flash": request.query_params.get("msg", ""),
        "flash_error": request.query_params.get("err", ""),
        "now": time.time(),
        "auth": dw.auth is not None,
        "page": name.removesuffix(".html"),
        "qs": _qs(request),
        "slack": SCHEDULER_SLACK,
        **context,
    }
    return dw.templates.TemplateResponse(request, name, ctx, status_code=status_code)


def _qs(request: Request) -> Callable[..., str]:
    """``qs(cursor=...)``: this page's query string with some values replaced."""

    def make(**changes: Any) -> str:
        params = {
            k: v for k, v in request.query_params.items() if k not in ("msg", "err", "cursor")
        }
        for k, v in changes.items():
            if v is None or v == "":
                params.pop(k, None)
            else:
                params[k] = str(v)
        return "?" + urlencode(params) if params else "?"

    return make


def back(request: Request, form: Any, default: str, **msg: str) -> Response:
    """303 to the page the form came from (``next``, a path inside the dashboard)
    with a message, so a reload does not POST again."""
    root = base(request)
    target = str(form.get("next") or "") if form else ""
    if not target.startswith(root + "/") or target.startswith("//") or "\\" in target:
        target = root + default
    path, _, query = target.partition("?")
    params = [
        (k, v)
        for k, v in (p.split("=", 1) if "=" in p else (p, "") for p in query.split("&") if p)
        if k not in ("msg", "err")
    ]
    params += [(k, v) for k, v in msg.items() if v]
    sep = "?" if params else ""
    return RedirectResponse(f"{path}{sep}{urlencode(params, safe='%+')}", status_code=303)


def not_found(request: Request, what: str) -> Response:
    return render(request, "error.html", {"title": "Not found", "message": what}, 404)


def page_size(request: Request) -> int:
    try:
        n = int(request.query_params.get("limit", DEFAULT_PAGE))
    except ValueError:
        return DEFAULT_PAGE
    return n if n in PAGE_SIZES else DEFAULT_PAGE
