"""The dashboard's state changes: every one a POST with a CSRF token.

Each handler checks the token before it reads anything else, acts through
the admin API, logs who asked (client address), and answers 303 to the page
the form came from with a message (Post/Redirect/Get: a reload never posts
twice).  Bulk actions on "all matching" dead letters require ``all=1`` when
no filter narrows them, as ``dumbwaiter dlq`` requires ``--all``.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import quote

import orjson
from starlette.datastructures import FormData
from starlette.requests import Request
from starlette.responses import PlainTextResponse, RedirectResponse, Response

from ..brokers.base import Broker
from ..brokers.types import JobFilter
from ..cancel import CANCELLED, REQUESTED, request_cancel
from ..durable import admin as runs_admin
from ..durable.errors import WorkflowNotFound, WorkflowStateError
from ..errors import ConfigurationError
from ..state import State
from .pages import dead_filter, queue_filter
from .security import session_cookie, verify_csrf
from .web import back, base, render_signin, state

log = logging.getLogger("dumbwaiter.dashboard")

Handler = Callable[[Request, FormData], Awaitable[Response]]

#: most ids one "selected" action takes
MAX_SELECTED = 1000
#: most retrying jobs one "retry all matching" moves (dead ones are replayed
#: by the broker in one call, with no such bound)
MAX_BULK = 10_000


def csrf_protected(fn: Handler) -> Callable[[Request], Awaitable[Response]]:
    async def handler(request: Request) -> Response:
        form = await request.form()
        if not verify_csrf(request, form, state(request).secret):
            log.warning(
                "refused a POST to %s without a valid CSRF token from %s",
                request.url.path,
                request.client.host if request.client else "?",
                extra={"action": "dashboard_csrf_refused"},
            )
            return PlainTextResponse(
                "403 Forbidden: missing or invalid CSRF token. Reload the page and try again.\n",
                status_code=403,
            )
        return await fn(request, form)

    handler.__name__ = fn.__name__
    handler.__doc__ = fn.__doc__
    return handler


def _who(request: Request) -> str:
    return f"dashboard@{request.client.host if request.client else '?'}"


def audit(request: Request, what: str, **extra: Any) -> None:
    log.info("%s by %s", what, _who(request), extra={"action": "dashboard_action", **extra})


@csrf_protected
async def queue_pause(request: Request, form: FormData) -> Response:
    queue = str(form.get("queue") or "")
    if not queue:
        return back(request, form, "/", err="no queue given")
    await state(request).broker.pause(queue)
    await state(request).cache.get(max_age=0)
    audit(request, f"paused queue {queue}")
    return back(request, form, f"/queues/{queue}", msg=f"paused {queue}")


@csrf_protected
async def queue_resume(request: Request, form: FormData) -> Response:
    queue = str(form.get("queue") or "")
    if not queue:
        return back(request, form, "/", err="no queue given")
    await state(request).broker.resume(queue)
    await state(request).cache.get(max_age=0)
    audit(request, f"resumed queue {queue}")
    return back(request, form, f"/queues/{queue}", msg=f"resumed {queue}")


@csrf_protected
async def job_cancel(request: Request, form: FormData) -> Response:
    """Cancel jobs not started; ask the workers of running ones to stop them
    (``dumbwaiter.cancel``: the request is stored in the broker, the worker
    reads it at its heartbeat, the handler sees ``ctx.cancelled``)."""
    ids = selected_ids(form)
    if not ids:
        return back(request, form, "/", err="no job selected")
    outcome = await request_cancel(state(request).broker, ids, _who(request))
    done = [i for i, o in outcome.items() if o == CANCELLED]
    asked = [i for i, o in outcome.items() if o == REQUESTED]
    refused = {i: o for i, o in outcome.items() if o not in (CANCELLED, REQUESTED)}
    audit(request, f"cancelled {len(done)} job(s), asked {len(asked)} to stop", ids=ids)
    parts = []
    if done:
        parts.append(f"cancelled {len(done)} job(s)")
    if asked:
        parts.append(f"asked {len(asked)} running job(s) to stop")
    err = "; ".join(f"{i}: {why}" for i, why in list(refused.items())[:5])
    if refused and not (done or asked):
        return back(request, form, "/", err=f"not cancelled: {err}")
    return back(
        request, form, "/", msg=", ".join(parts), err=f"not cancelled: {err}" if err else ""
    )


# -- bulk actions on a queue ---------------------------------------------------------


def _queue_selection(
    request: Request, form: FormData
) -> tuple[str, JobFilter | None, State | None, tuple[str, ...], str]:
    """The jobs a queue page's bulk form means: ``scope`` = ``selected`` (the
    ``id`` fields) or ``matching`` (the page's filter fields, as the page
    showed them).  Returns (queue, filter, state tab, ids, error)."""
    queue = str(form.get("queue") or "")
    if not queue:
        return queue, None, None, (), "no queue given"
    scope = str(form.get("scope") or "selected")
    if scope == "selected":
        ids = selected_ids(form)
        if not ids:
            return queue, None, None, (), "select at least one job"
        return queue, JobFilter(queue=queue, ids=ids), None, ids, ""
    if scope != "matching":
        return queue, None, None, (), f"unknown scope {scope!r}"
    if str(form.get("args") or "").strip():
        return (
            queue,
            None,
            None,
            (),
            ("an argument search is not a filter the broker can apply: select the jobs instead"),
        )
    errors: list[str] = []
    f, wanted = queue_filter(state(request).app, queue, form, errors)
    if errors:
        return queue, None, None, (), "; ".join(errors)
    narrowed = wanted is not None or any(v is not None for v in (f.name, f.since, f.until, f.key))
    if not narrowed and form.get("all") != "1":
        return (
            queue,
            None,
            None,
            (),
            (f"refusing to act on every job of {queue} without all=1 (confirm it)"),
        )
    return queue, f, wanted, (), ""


@csrf_protected
async def queue_retry(request: Request, form: FormData) -> Response:
    """Dead jobs get fresh attempts (``replay``); retrying jobs (and, when
    selected, scheduled ones) run now instead of at their next attempt."""
    queue, f, wanted, ids, error = _queue_selection(request, form)
    if f is None:
        return back(request, form, f"/queues/{queue}" if queue else "/", err=error)
    broker = state(request).broker
    if wanted not in (None, State.DEAD, State.RETRYING):
        return back(request, form, f"/queues/{queue}", err=f"{wanted} jobs cannot be retried")
    now = time.time()
    moved = 0
    if ids:  # first: the dead ones replayed below are not counted twice
        moved = len(await broker.reschedule(ids, now))
    elif wanted in (None, State.RETRYING):
        moved = await _run_now(broker, dataclasses.replace(f, state=State.RETRYING), now)
    replayed = 0
    if wanted in (None, State.DEAD):
        replayed = await broker.replay(dataclasses.replace(f, state=State.DEAD))
    await state(request).cache.get(max_age=0)
    audit(request, f"retried {replayed} dead and {moved} waiting job(s) of {queue}")
    return back(
        request,
        form,
        f"/queues/{queue}",
        msg=f"replayed {replayed} dead job(s), {moved} to run now",
    )


async def _run_now(broker: Broker, f: JobFilter, at: float) -> int:
    """Reschedule the jobs of ``f`` to ``at``, page by page, at most MAX_BULK."""
    moved = 0
    cursor = None
    seen = 0
    while seen < MAX_BULK:
        page = await broker.list_jobs(f, cursor, min(500, MAX_BULK - seen))
        if not page.items:
            break
        ids = [i.message.id for i in page.items]
        seen += len(ids)
        moved += len(await broker.reschedule(ids, at))
        if page.cursor is None:
            break
        cursor = page.cursor
    return moved


@csrf_protected
async def queue_delete(request: Request, form: FormData) -> Response:
    """Delete jobs that are not running (``purge``): the selected ones, or
    every one the page's filter matches."""
    queue, f, wanted, _, error = _queue_selection(request, form)
    if f is None:
        return back(request, form, f"/queues/{queue}" if queue else "/", err=error)
    if wanted is State.RUNNING:
        return back(request, form, f"/queues/{queue}", err="running jobs cannot be deleted")
    n = await state(request).broker.purge(dataclasses.replace(f, state=wanted))
    await state(request).cache.get(max_age=0)
    audit(request, f"deleted {n} job(s) of {queue}", filter=repr(f))
    return back(request, form, f"/queues/{queue}", msg=f"deleted {n} job{'s' if n != 1 else ''}")


def selected_ids(form: FormData) -> tuple[str, ...]:
    ids = [str(v).strip() for v in form.getlist("id") if str(v).strip()]
    return tuple(dict.fromkeys(ids))[:MAX_SELECTED]


def _dead_selection(request: Request, form: FormData) -> tuple[JobFilter | None, str]:
    """The dead letters a bulk form means: ``scope`` = ``selected`` (the ``id``
    fields) or ``matching`` (the filter fields).  Returns (filter, error)."""
    scope = str(form.get("scope") or "selected")
    if scope == "selected":
        ids = selected_ids(form)
        if not ids:
            return None, "select at least one dead letter"
        return JobFilter(state=State.DEAD, ids=ids), ""
    if scope != "matching":
        return None, f"unknown scope {scope!r}"
    errors: list[str] = []
    f = dead_filter(state(request).app, form, errors)
    if errors:
        return None, "; ".join(errors)
    narrowed = any(v is not None for v in (f.queue, f.name, f.error_type, f.since, f.until))
    if not narrowed and form.get("all") != "1":
        return None, "refusing to act on every dead letter without all=1 (confirm it)"
    return f, ""


@csrf_protected
async def dead_replay(request: Request, form: FormData) -> Response:
    f, error = _dead_selection(request, form)
    if f is None:
        return back(request, form, "/dead", err=error)
    n = await state(request).broker.replay(f)
    await state(request).cache.get(max_age=0)
    audit(request, f"replayed {n} dead letter(s)", filter=repr(f))
    return back(request, form, "/dead", msg=f"replayed {n} dead letter{'s' if n != 1 else ''}")


@csrf_protected
async def dead_purge(request: Request, form: FormData) -> Response:
    f, error = _dead_selection(request, form)
    if f is None:
        return back(request, form, "/dead", err=error)
    n = await state(request).broker.purge(f)
    await state(request).cache.get(max_age=0)
    audit(request, f"purged {n} dead letter(s)", filter=repr(f))
    return back(request, form, "/dead", msg=f"purged {n} dead letter{'s' if n != 1 else ''}")


@csrf_protected
async def schedule(request: Request, form: FormData) -> Response:
    verb = request.path_params["verb"]
    name = str(form.get("name") or "")
    dw = state(request)
    try:
        from ..scheduler import find, list_schedules, pause, resume, trigger
    except ImportError:
        return back(request, form, "/schedules", err="no scheduler in this version")
    try:
        full = find([i.name for i in await list_schedules(dw.app)], name)
    except ConfigurationError as exc:
        return back(request, form, "/schedules", err=str(exc))
    if verb == "pause":
        await pause(dw.broker, full, _who(request))
        msg = f"paused {full}"
    elif verb == "resume":
        was = await resume(dw.broker, full)
        msg = f"resumed {full}" if was else f"{full} was not paused"
    elif verb == "trigger":
        try:
            job_id = await trigger(dw.app, full, _who(request))
        except ConfigurationError as exc:
            return back(request, form, "/schedules", err=str(exc))
        msg = f"triggered {full}: job {job_id}"
    else:
        return back(request, form, "/schedules", err=f"unknown action {verb!r}")
    audit(request, msg, schedule=full)
    return back(request, form, "/schedules", msg=msg)


@csrf_protected
async def alerts_evaluate(request: Request, form: FormData) -> Response:
    from ..alerts import AlertService, effective_config

    dw = state(request)
    sent = await AlertService(dw.app, effective_config(dw.app), cache=dw.cache).evaluate()
    audit(request, "evaluated the alert rules")
    return back(request, form, "/alerts", msg=f"evaluated: {len(sent)} notification(s) sent")


async def login(request: Request) -> Response:
    """The sign-in form's POST: set the session cookie (an HMAC of the
    credentials, never the credentials)."""
    dw = state(request)
    form = await request.form()
    if not verify_csrf(request, form, dw.secret):
        return PlainTextResponse("403 Forbidden: missing or invalid CSRF token\n", 403)
    root = base(request)
    if dw.auth is None:
        return RedirectResponse(root + "/", 303)
    if not dw.auth.signs_in(form):
        log.warning(
            "failed dashboard sign-in from %s",
            request.client.host if request.client else "?",
            extra={"action": "dashboard_login_failed"},
        )
        nxt = str(form.get("next") or "")
        return render_signin(request, failed=True, status_code=401, nxt=nxt)
    nxt = str(form.get("next") or "")
    target = nxt if nxt.startswith(root + "/") and not nxt.startswith("//") else root + "/"
    if "\\" in target:
        target = root + "/"
    resp = RedirectResponse(target, 303)
    resp.headers.append(
        "set-cookie",
        session_cookie(dw.auth, dw.secret, root or "/", request.url.scheme == "https"),
    )
    return resp


# -- durable workflow runs: what ``dumbwaiter workflows cancel|retry|signal`` do -------


def _runs(form: FormData) -> tuple[str, ...]:
    runs = [str(v).strip() for v in form.getlist("run") if str(v).strip()]
    return tuple(dict.fromkeys(runs))[:MAX_SELECTED]


def _run_page(runs: tuple[str, ...]) -> str:
    return f"/workflows/{quote(runs[0], safe='')}" if len(runs) == 1 else "/workflows"


def _short(text: str) -> str:
    """A refusal as the page's message (a payload's validation errors can be long)."""
    return text if len(text) <= 400 else text[:399] + "…"


@csrf_protected
async def workflow_cancel(request: Request, form: FormData) -> Response:
    """Cancel runs that have not ended (``durable.admin.cancel``): no further
    step starts, nothing is compensated."""
    runs = _runs(form)
    if not runs:
        return back(request, form, "/workflows", err="no run given")
    app = state(request).app
    done: list[str] = []
    refused: list[str] = []
    for run in runs:
        try:
            if await runs_admin.cancel(app, run):
                done.append(run)
            else:
                refused.append(
                    f"{run} was not cancelled: it is {await runs_admin.status(app, run)}"
                )
        except WorkflowNotFound as exc:
            refused.append(str(exc))
    audit(request, f"cancelled {len(done)} workflow run(s)", runs=runs)
    msg = f"cancelled {', '.join(done)}" if done else ""
    return back(request, form, _run_page(runs), msg=msg, err=_short("; ".join(refused)))


@csrf_protected
async def workflow_retry(request: Request, form: FormData) -> Response:
    """Resume failed runs from the step that failed (``durable.admin.retry_run``:
    the steps before it keep their checkpoints)."""
    runs = _runs(form)
    if not runs:
        return back(request, form, "/workflows", err="no run given")
    app = state(request).app
    done: list[str] = []
    refused: list[str] = []
    for run in runs:
        try:
            await runs_admin.retry_run(app, run)
            done.append(run)
        except (WorkflowNotFound, WorkflowStateError) as exc:
            refused.append(str(exc))
    audit(request, f"resumed {len(done)} workflow run(s)", runs=runs)
    msg = f"resumed {', '.join(done)}" if done else ""
    return back(request, form, _run_page(runs), msg=msg, err=_short("; ".join(refused)))


@csrf_protected
async def workflow_signal(request: Request, form: FormData) -> Response:
    """Resolve the event wait a run is parked at with the form's JSON payload,
    as if a matching event had been published (``durable.admin.signal``,
    which validates it against the event class when this process knows it)."""
    runs = _runs(form)
    if len(runs) != 1:
        return back(request, form, "/workflows", err="a signal goes to one run")
    run = runs[0]
    try:
        payload = orjson.loads(str(form.get("payload") or ""))
    except orjson.JSONDecodeError as exc:
        return back(request, form, _run_page(runs), err=f"the payload is not JSON: {exc}")
    step = str(form.get("step") or "").strip() or None
    try:
        await runs_admin.signal(state(request).app, run, payload, step)
    except (WorkflowNotFound, WorkflowStateError) as exc:
        return back(request, form, _run_page(runs), err=_short(str(exc)))
    audit(request, f"signalled workflow run {run}", run=run, step=step)
    return back(request, form, _run_page(runs), msg=f"signalled {run}")
