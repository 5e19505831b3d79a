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
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.templating import Jinja2Templates

from ..app import App
from ..metrics import SCHEDULER_SLACK, StatsCache
from ..redact import mask_url
from .security import Auth

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
