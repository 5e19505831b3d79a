"""The dashboard's pages (GET): overview, queue, job, dead letters, workers,
schedules, alerts, and /metrics."""

from __future__ import annotations

import time
from typing import Any

from starlette.requests import Request
from starlette.responses import PlainTextResponse, RedirectResponse, Response

from ..app import App
from ..brokers.base import JobFilter, QueueStats
from ..cli.output import parse_time, raw_text
from ..doctor import host_scope
from ..errors import ConfigurationError
from ..message import GROUP_PREFIX
from ..state import CANCELLABLE_STATES, FINAL_STATES, State
from ..task import full_name
from . import queries, throughput
from .web import not_found, page_size, render, state


async def overview(request: Request) -> Response:
    dw = state(request)
    snap = await dw.cache.get()
    now = time.time()
    points = await throughput.series(dw.broker, now)
    queues = [s for s in snap.stats if not s.queue.startswith(GROUP_PREFIX)]
    groups = [s for s in snap.stats if s.queue.startswith(GROUP_PREFIX)]
    from ..alerts import active_alerts

    firing = await active_alerts(dw.broker)
    done = [p.total for p in points if p.total is not None]
    return render(
        request,
        "overview.html",
        {
            "queues": queues,
            "groups": groups,
            "totals": _totals(snap.stats),
            "workers": snap.workers,
            "snapshot_at": snap.at,
            "chart": throughput.svg(points),
            "last_hour": sum(done),
            "sampled": len(done),
            "firing": firing,
            "scheduler": snap.scheduler,
            "scope": host_scope(dw.app),
        },
    )


def _totals(stats: tuple[QueueStats, ...]) -> dict[str, float]:
    keys = ("ready", "scheduled", "retrying", "running", "prefetched", "dead", "succeeded")
    out: dict[str, float] = {k: sum(getattr(s, k) for s in stats) for k in keys}
    out["lag"] = max((s.lag for s in stats), default=0.0)
    return out


def _time_param(request: Request, name: str, errors: list[str]) -> float | None:
    text = request.query_params.get(name, "").strip()
    if not text:
        return None
    try:
        return parse_time(text)
    except ValueError as exc:
        errors.append(f"{name}: {exc}")
        return None


def _state_param(value: str) -> State | None:
    try:
        return State(value)
    except ValueError:
        return None


async def queue(request: Request) -> Response:
    dw = state(request)
    name = request.path_params["queue"]
    snap = await dw.cache.get()
    stats = snap.queue(name)
    p = request.query_params
    job_id = p.get("id", "").strip()
    if job_id:
        info = await dw.broker.get(job_id)
        if info is not None:
            return RedirectResponse(f"{request.scope.get('root_path', '')}/jobs/{job_id}", 303)
    errors: list[str] = []
    tab = p.get("state", "all")
    wanted = _state_param(tab)
    if tab != "all" and wanted is None:
        errors.append(f"unknown state {tab!r}")
        tab = "all"
    base = JobFilter(
        queue=name,
        name=task_param(dw.app, p.get("task"), errors),
        since=_time_param(request, "since", errors),
        until=_time_param(request, "until", errors),
        key=p.get("key", "").strip() or None,
    )
    filters = queries.split(base, None, [wanted] if wanted else list(queries.STATES))
    limit = page_size(request)
    cursor = p.get("cursor") or None
    listing = await queries.merged(dw.broker, filters, cursor, limit)
    return render(
        request,
        "queue.html",
        {
            "name": name,
            "is_group": name.startswith(GROUP_PREFIX),
            "stats": stats,
            "workers_on": snap.workers_on(name),
            "tab": tab,
            "states": queries.STATES,
            "listing": listing,
            "errors": errors,
            "missing_id": job_id if job_id else "",
            "limit": limit,
            "cursor": cursor,
        },
    )


async def job(request: Request) -> Response:
    dw = state(request)
    info = await dw.broker.get(request.path_params["id"])
    if info is None:
        return not_found(request, "No job with this id is stored (never enqueued, or pruned).")
    result: Any = None
    result_error: str | None = None
    if info.result is not None:
        from ..message import loads

        try:
            stored = loads(info.result)
            if isinstance(stored, dict) and "value" in stored:
                result = stored["value"]
            elif isinstance(stored, dict):
                result_error = str(stored.get("error"))
        except ValueError:
            result_error = "unreadable"
    return render(
        request,
        "job.html",
        {
            "info": info,
            "m": info.message,
            "result": result,
            "has_result": info.result is not None and result_error is None,
            "result_error": result_error,
            "cancellable": info.state in CANCELLABLE_STATES,
            "dead": info.state is State.DEAD,
            # a job on its way refreshes itself until it is final
            "live": info.state not in FINAL_STATES and info.state is not State.DEAD,
            "raw": raw_text(info.raw)[0] if info.raw is not None else None,
            "raw_utf8": info.raw is None or raw_text(info.raw)[1],
        },
    )


def task_param(app: App, value: Any, errors: list[str]) -> str | None:
    """A ``task`` filter field as stored: a short name means the app's one
    task ending in it, as on the command line (``task.full_name``)."""
    text = str(value or "").strip()
    if not text:
        return None
    try:
        return full_name(app, text)
    except ConfigurationError as exc:
        errors.append(str(exc))
        return text


def dead_filter(app: App, params: Any, errors: list[str]) -> JobFilter:
    """The dead-letter selection of a query string or form (shared by the page
    and its bulk actions, so "all matching" means what the page showed)."""

    def when(name: str) -> float | None:
        text = str(params.get(name) or "").strip()
        if not text:
            return None
        try:
            return parse_time(text)
        except ValueError as exc:
            errors.append(f"{name}: {exc}")
            return None

    error = str(params.get("error") or "").strip().removeprefix("builtins.")
    return JobFilter(
        queue=str(params.get("queue") or "").strip() or None,
        name=task_param(app, params.get("task"), errors),
        state=State.DEAD,
        error_type=error or None,
        since=when("since"),
        until=when("until"),
    )


async def dead(request: Request) -> Response:
    dw = state(request)
    snap = await dw.cache.get()
    errors: list[str] = []
    f = dead_filter(dw.app, request.query_params, errors)
    queues = [s.queue for s in snap.stats if s.dead] if f.queue is None else None
    filters = queries.split(f, queues, None) if queues else [f]
    limit = page_size(request)
    cursor = request.query_params.get("cursor") or None
    if f.queue is None and not queues:
        listing = queries.Listing([], None)
    else:
        listing = await queries.merged(dw.broker, filters, cursor, limit)
    return render(
        request,
        "dead.html",
        {
            "f": f,
            "params": request.query_params,
            "queues": [s for s in snap.stats if s.dead or s.queue == f.queue],
            "total_dead": sum(s.dead for s in snap.stats),
            "listing": listing,
            "errors": errors,
            "narrowed": any(
                v is not None for v in (f.queue, f.name, f.error_type, f.since, f.until)
            ),
            "limit": limit,
            "cursor": cursor,
        },
    )


async def workers(request: Request) -> Response:
    dw = state(request)
    snap = await dw.cache.get()
    return render(request, "workers.html", {"workers": snap.workers, "snapshot_at": snap.at})


async def schedules(request: Request) -> Response:
    dw = state(request)
    try:
        from ..scheduler import list_schedules
    except ImportError:
        return render(request, "schedules.html", {"available": False, "rows": []})
    snap = await dw.cache.get()
    rows = await list_schedules(dw.app)
    return render(
        request,
        "schedules.html",
        {"available": True, "rows": rows, "health": snap.scheduler},
    )


async def alerts(request: Request) -> Response:
    dw = state(request)
    from ..alerts import AlertConfig, active_alerts, config_of, history

    cfg = config_of(dw.app)
    return render(
        request,
        "alerts.html",
        {
            "firing": await active_alerts(dw.broker),
            "history": await history(dw.broker, 50),
            "config": cfg or AlertConfig(),
            "configured": cfg is not None,
            "evaluating": dw.alerts,
        },
    )


async def metrics(request: Request) -> Response:
    dw = state(request)
    try:
        from ..metrics import exposition, register_collector
    except ImportError:  # pragma: no cover - metrics.py itself has no hard dependency
        return PlainTextResponse("metrics unavailable\n", status_code=501)
    try:
        if dw.registry is None:
            from prometheus_client import CollectorRegistry

            registry = CollectorRegistry(auto_describe=True)
            register_collector(registry, dw.cache)
            dw.registry = registry
        await dw.cache.get()
        body, content_type = exposition(dw.registry)
    except ImportError:
        return PlainTextResponse(
            "metrics need prometheus-client: pip install 'dumbwaiter[metrics]'\n",
            status_code=501,
        )
    return Response(body, media_type=content_type)


async def login(request: Request) -> Response:
    dw = state(request)
    if dw.auth is None or dw.auth.scheme != "token":
        return RedirectResponse(f"{request.scope.get('root_path', '')}/", 303)
    return render(request, "login.html", {"next": request.query_params.get("next", "")})
