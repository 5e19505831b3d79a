"""The dashboard's pages (GET): overview, queue, job, events, dead letters,
workers, schedules, alerts, workflow runs, the sign-in form, and /metrics."""

from __future__ import annotations

import time
from typing import Any
from urllib.parse import quote

from starlette.requests import Request
from starlette.responses import PlainTextResponse, RedirectResponse, Response

from ..app import App
from ..brokers.types import JobFilter, QueueStats
from ..cancel import pending
from ..cli.output import parse_time, raw_text
from ..doctor import host_scope
from ..durable import admin as runs_admin
from ..durable.api import workflows as registered_workflows
from ..durable.errors import WorkflowNotFound
from ..durable.jobs import TASK_PREFIX, run_of, task_name
from ..durable.store import PENDING_STATE, RUNNING
from ..durable.store import STATES as RUN_STATES
from ..errors import ConfigurationError
from ..message import GROUP_PREFIX
from ..state import CANCELLABLE_STATES, FINAL_STATES, State
from ..task import full_name
from . import events as event_reads
from . import jobview, queries, runview, search, throughput
from .web import not_found, page_size, render, render_signin, state


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


def _time_param(params: Any, name: str, errors: list[str]) -> float | None:
    text = str(params.get(name) or "").strip()
    if not text:
        return None
    try:
        return parse_time(text)
    except ValueError as exc:
        errors.append(f"{name}: {exc}")
        return None


def queue_filter(
    app: App, queue: str, params: Any, errors: list[str]
) -> tuple[JobFilter, State | None]:
    """The selection of a queue page's query string or form (shared by the
    page and its bulk actions, so "all matching" means what the page showed):
    the filter without its state, and the state tab (None: every state)."""
    tab = str(params.get("state") or "all")
    wanted = _state_param(tab)
    if tab != "all" and wanted is None:
        errors.append(f"unknown state {tab!r}")
    base = JobFilter(
        queue=queue,
        name=task_param(app, params.get("task"), errors),
        since=_time_param(params, "since", errors),
        until=_time_param(params, "until", errors),
        key=str(params.get("key") or "").strip() or None,
    )
    return base, wanted


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
    base, wanted = queue_filter(dw.app, name, p, errors)
    tab = wanted.value if wanted is not None else "all"
    filters = queries.split(base, None, [wanted] if wanted else list(queries.STATES))
    limit = page_size(request)
    cursor = p.get("cursor") or None
    args_query = p.get("args", "").strip()
    found: search.Found | None = None
    if args_query:
        test = search.matcher(dw.app, args_query)
        found = await search.search(dw.broker, filters, cursor, limit, test)
        listing = queries.Listing(found.items, found.cursor)
    else:
        listing = await queries.merged(dw.broker, filters, cursor, limit)
    return render(
        request,
        "queue.html",
        {
            "name": name,
            "is_group": name.startswith(GROUP_PREFIX),
            "stats": stats,
            "partitions": [pl for pl in await dw.broker.partition_lag() if pl.queue == name],
            "workers_on": snap.workers_on(name),
            "tab": tab,
            "states": queries.STATES,
            "listing": listing,
            "found": found,
            "errors": errors,
            "missing_id": job_id if job_id else "",
            "limit": limit,
            "cursor": cursor,
            "narrowed": any(
                v is not None for v in (base.name, base.since, base.until, base.key, wanted)
            ),
        },
    )


async def job(request: Request) -> Response:
    dw = state(request)
    info = await dw.broker.get(request.path_params["id"])
    if info is None:
        return not_found(request, "No job with this id is stored (never enqueued, or pruned).")
    done = info.outcome()
    result_error = str(done["error"]) if "error" in done else None
    asked: dict[str, object] | None = None
    # a segment job of a durable run: the run it carries
    run = run_of(info.message) if info.message.name.startswith(TASK_PREFIX) else None
    if info.state is State.RUNNING:
        asked = (await pending(dw.broker, [info.message.id])).get(info.message.id)
    return render(
        request,
        "job.html",
        {
            "info": info,
            "m": info.message,
            "result": done.get("value"),
            "has_result": "value" in done,
            "result_error": result_error,
            "cancellable": info.state in CANCELLABLE_STATES,
            # a running job can be asked to stop (its handler sees ctx.cancelled)
            "stoppable": info.state is State.RUNNING and asked is None,
            "cancel_asked": asked,
            "dead": info.state is State.DEAD,
            # a job on its way refreshes itself until it is final
            "live": info.state not in FINAL_STATES and info.state is not State.DEAD,
            "raw": raw_text(info.raw)[0] if info.raw is not None else None,
            "raw_utf8": info.raw is None or raw_text(info.raw)[1],
            "arguments": jobview.arguments(dw.app, info.message),
            "timing": jobview.timing(info, time.time()),
            "workflow_run": run,
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
    """The sign-in form: it shows nothing of the deployment (signin.html)."""
    dw = state(request)
    if dw.auth is None:
        return RedirectResponse(f"{request.scope.get('root_path', '')}/", 303)
    return render_signin(request, failed=False, status_code=200)


async def events(request: Request) -> Response:
    """Recent events by type, their payload, and what each group did with them
    (dashboard/events.py says where each part comes from and what it costs)."""
    dw = state(request)
    if not dw.broker.capabilities.events:
        return render(request, "events.html", {"available": False})
    snap = await dw.cache.get()
    p = request.query_params
    errors: list[str] = []
    types = await event_reads.known_types(dw.app, dw.broker, snap.stats)
    chosen = p.get("type", "").strip()
    if chosen and chosen not in {t.name for t in types}:
        types.append(event_reads.EventType(chosen))  # a type no group or class knows
    selected = [t for t in types if t.name == chosen] if chosen else types
    until = _time_param(p, "until", errors)
    limit = page_size(request)
    recent = await event_reads.recent(dw.app, dw.broker, selected, limit, until)
    return render(
        request,
        "events.html",
        {
            "available": True,
            "types": types,
            "chosen": chosen,
            "recent": recent,
            "errors": errors,
            "limit": limit,
            "until": until,
            "retention": dw.app.event_retention,
        },
    )


# -- durable workflow runs ----------------------------------------------------------

#: the statuses the runs list filters by (a run with no record yet is
#: ``pending`` and is not in the list: its page and its first job show it)
RUN_STATUSES = tuple(s for s in RUN_STATES if s != PENDING_STATE)


async def workflows(request: Request) -> Response:
    """The runs the broker keeps, newest first (``durable.admin.list_runs``,
    as ``dumbwaiter workflows ls``), by workflow and status."""
    dw = state(request)
    p = request.query_params
    run_id = p.get("id", "").strip()
    if run_id:
        root = request.scope.get("root_path", "")
        return RedirectResponse(f"{root}/workflows/{quote(run_id, safe='')}", 303)
    errors: list[str] = []
    status = p.get("status", "").strip() or None
    if status is not None and status not in RUN_STATUSES:
        errors.append(f"unknown status {status!r}")
        status = None
    workflow = p.get("workflow", "").strip() or None
    limit = page_size(request)
    runs = await runs_admin.list_runs(dw.app, status=status, workflow=workflow, limit=limit)
    return render(
        request,
        "workflows.html",
        {
            "runs": [(r, runview.waiting(r)) for r in runs],
            "status": status or "all",
            "statuses": RUN_STATUSES,
            "workflow": workflow or "",
            "known": sorted(registered_workflows(dw.app)),
            "errors": errors,
            "limit": limit,
        },
    )


async def workflow_run(request: Request) -> Response:
    """One run: its inputs, status, what it waits for, and the timeline of its
    steps (``durable.admin.describe``, as ``dumbwaiter workflows show``)."""
    dw = state(request)
    run_id = request.path_params["run"]
    try:
        run = await runs_admin.describe(dw.app, run_id)
    except WorkflowNotFound as exc:
        return not_found(request, str(exc))
    # the job that carries the run now (a pending run's is its first job)
    job_id = run.get("job") or (run_id if run.get("status") == PENDING_STATE else None)
    job = await dw.broker.get(str(job_id)) if job_id else None
    now = time.time()  # after the reads; the page's times are all as of now
    waits = runview.waiting(run)
    args, kwargs = run.get("args") or [], run.get("kwargs") or {}
    return render(
        request,
        "workflow_run.html",
        {
            "page": "workflows",
            "now": now,
            "run": run,
            "waiting": waits,
            "timeline": runview.timeline(run, now),
            # by the workflow's parameter names, when this app registers it
            "inputs": jobview.named(dw.app, task_name(str(run.get("workflow"))), args, kwargs),
            "job": job,
            "job_id": job_id,
            "final": run.get("status") in runview.FINAL,
            "live": run.get("status") in (PENDING_STATE, RUNNING),
            "retryable": runview.retryable(run, job is not None and job.state is State.DEAD),
            "signal_match": waits.match if waits is not None and waits.kind == "event" else None,
        },
    )
