"""The webhook endpoints pages and their actions (``dumbwaiter.webhooks``).

``/webhooks`` lists every registered endpoint with what an operator asks
first: is it enabled (or disabled by a 410 Gone, or by someone), what its
circuit breaker says, how many deliveries failed lately, and how many are
dead.  ``/webhooks/{id}`` is one endpoint with its dead deliveries.  The
actions replay an endpoint's dead deliveries (all, or those selected),
enable a disabled endpoint, and disable one.

Everything is read and done through the app's ``app.webhooks`` (health,
dead, replay, enable, disable), so the page shows what the library's own
calls return; the endpoints are in the broker's kv store, so a dashboard
of a bare broker URL sees them too (with the default delivery queue).
Touching ``app.webhooks`` registers the delivery task on the dashboard's
app, which only lets this process name the task; it sends nothing.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from starlette.datastructures import FormData
from starlette.requests import Request
from starlette.responses import Response

from .actions import audit, csrf_protected, selected_ids
from .web import back, not_found, page_size, render, state

if TYPE_CHECKING:
    from ..webhooks.endpoints import Endpoint
    from ..webhooks.service import Webhooks

#: the windows the failure rate can be read over (minutes)
WINDOWS = (15, 60, 1440)
DEFAULT_WINDOW = 60


def _hooks(request: Request) -> tuple[Webhooks | None, str]:
    """The app's webhooks service, or None and why (the extra is missing)."""
    try:
        return state(request).app.webhooks, ""
    except ImportError as exc:  # httpx / standardwebhooks not installed
        why = str(exc)
        if "pip install" not in why:
            why += "; pip install 'dumbwaiter[webhooks]'"
        return None, why


def _window(request: Request) -> int:
    try:
        n = int(request.query_params.get("minutes", DEFAULT_WINDOW))
    except ValueError:
        return DEFAULT_WINDOW
    return n if n in WINDOWS else DEFAULT_WINDOW


async def endpoints(request: Request) -> Response:
    """Every endpoint: enabled or not, breaker, failure rate, dead deliveries."""
    hooks, missing = _hooks(request)
    if hooks is None:
        return render(request, "webhooks.html", {"available": False, "missing": missing})
    minutes = _window(request)
    rows = await hooks.ahealth(minutes=minutes)
    return render(
        request,
        "webhooks.html",
        {
            "available": True,
            "rows": rows,
            "minutes": minutes,
            "windows": WINDOWS,
            "disabled": sum(1 for r in rows if r["disabled"]),
            "open": sum(1 for r in rows if r["breaker"] != "closed"),
            "dead": sum(int(r["dead"]) for r in rows),
        },
    )


async def endpoint(request: Request) -> Response:
    """One endpoint: its settings and health, and its dead deliveries."""
    hooks, missing = _hooks(request)
    if hooks is None:
        return render(request, "webhooks.html", {"available": False, "missing": missing})
    from ..webhooks.endpoints import EndpointNotFound

    endpoint_id = request.path_params["id"]
    minutes = _window(request)
    try:
        [health] = await hooks.ahealth(endpoint_id, minutes=minutes)
    except EndpointNotFound:
        return not_found(request, f"No webhook endpoint {endpoint_id!r} is registered.")
    limit = page_size(request)
    dead = [hooks.describe(i) for i in await hooks.adead(endpoint_id, limit=limit)]
    return render(
        request,
        "webhook.html",
        {
            "page": "webhooks",
            "ep": health,
            "dead": dead,
            "limit": limit,
            "minutes": minutes,
            "windows": WINDOWS,
        },
    )


async def _act(request: Request, form: FormData) -> tuple[Webhooks, Endpoint] | Response:
    """The service and the form's endpoint (read: it must exist), or the
    answer that refuses."""
    endpoint_id = str(form.get("endpoint") or "").strip()
    hooks, missing = _hooks(request)
    if hooks is None:
        return back(request, form, "/webhooks", err=missing)
    if not endpoint_id:
        return back(request, form, "/webhooks", err="no endpoint given")
    from ..webhooks.endpoints import EndpointNotFound

    try:
        return hooks, await hooks.aendpoint(endpoint_id)
    except EndpointNotFound:
        return back(request, form, "/webhooks", err=f"no webhook endpoint {endpoint_id!r}")


@csrf_protected
async def replay(request: Request, form: FormData) -> Response:
    """Deliver an endpoint's dead deliveries again (``app.webhooks.replay``):
    all of them (``scope=all``) or the selected ``id`` fields, with fresh
    attempts and the same ``webhook-id``."""
    got = await _act(request, form)
    if isinstance(got, Response):
        return got
    hooks, ep = got
    page = f"/webhooks/{ep.id}"
    scope = str(form.get("scope") or "selected")
    ids: tuple[str, ...] | None = None
    if scope == "selected":
        ids = selected_ids(form)
        if not ids:
            return back(request, form, page, err="select at least one dead delivery")
    elif scope != "all":
        return back(request, form, page, err=f"unknown scope {scope!r}")
    n = await hooks.areplay(ep.id, ids)
    await state(request).cache.get(max_age=0)
    audit(request, f"replayed {n} dead webhook deliveries to {ep.id}", endpoint=ep.id)
    msg = f"replayed {n} dead deliver{'ies' if n != 1 else 'y'} to {ep.id}"
    # to a disabled endpoint they would only die again, with its reason
    warn = f"{ep.id} is disabled: enable it, then replay" if ep.disabled and n else ""
    return back(request, form, page, msg=msg, err=warn)


@csrf_protected
async def enable(request: Request, form: FormData) -> Response:
    """Deliver to a disabled endpoint again (its circuit breaker starts closed);
    what died while it was disabled waits for a replay."""
    got = await _act(request, form)
    if isinstance(got, Response):
        return got
    hooks, ep = got
    await hooks.aenable(ep.id)
    audit(request, f"enabled webhook endpoint {ep.id}", endpoint=ep.id)
    return back(request, form, f"/webhooks/{ep.id}", msg=f"enabled {ep.id}")


@csrf_protected
async def disable(request: Request, form: FormData) -> Response:
    """Stop delivering to an endpoint: new webhooks skip it or are refused, and
    queued ones dead-letter with the reason (``app.webhooks.disable``)."""
    got = await _act(request, form)
    if isinstance(got, Response):
        return got
    hooks, ep = got
    who = request.client.host if request.client else "?"
    reason = str(form.get("reason") or "").strip()[:200] or f"disabled from the dashboard ({who})"
    await hooks.adisable(ep.id, reason)
    audit(request, f"disabled webhook endpoint {ep.id}", endpoint=ep.id)
    return back(request, form, f"/webhooks/{ep.id}", msg=f"disabled {ep.id}")
