"""The dashboard's ASGI app put together: its routes over the pages,
actions and webhooks modules, its lifespan (the stats sampler, the alert
rules) and the sign-in guard.

Apart from ``web.py`` (the state and rendering helpers every page shares)
so that the page modules import ``web`` and this module imports them, with
no circle between them.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets as _secrets
from collections.abc import AsyncIterator
from datetime import UTC, datetime

import jinja2
import orjson
from starlette.applications import Starlette
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.templating import Jinja2Templates

from ..app import App
from ..cli.output import duration, relative, timestamp, took
from ..metrics import StatsCache
from . import actions, pages, webhooks
from .security import Auth, Guard, SignIn
from .web import HERE, Dashboard, log


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
