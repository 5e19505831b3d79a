"""What the job page shows beyond the stored fields: arguments by name, and
the attempt's times (started, finished, how long, the next attempt).

Both are worked out here, above the seam, from what every broker stores:
the task's signature (when the app registers the task), the worker's record
of a successful attempt (``JobInfo.outcome``), each failed attempt's
``ErrorRecord`` (``started``, ``time``), ``run_at`` and ``updated_at``.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Any

from ..app import App
from ..brokers.types import JobInfo
from ..message import Message
from ..state import State


@dataclass(frozen=True, slots=True)
class Arg:
    #: the parameter's name; ``None`` for a positional value whose name is unknown
    name: str | None
    value: Any
    #: "default" (not passed: the signature's default), "extra" (caught by
    #: ``*args``/``**kwargs``), or ""
    note: str = ""


@dataclass(frozen=True, slots=True)
class Arguments:
    rows: list[Arg] = field(default_factory=list)
    #: where the names came from: "signature", "keywords" (no task code: only
    #: keyword arguments are named), or "mismatch" (the stored arguments do
    #: not fit the registered signature any more)
    source: str = "keywords"
    why: str = ""


def arguments(app: App, m: Message) -> Arguments:
    """``m``'s arguments beside their parameter names, from the signature of
    the task the app registers under ``m.name``; positional only when the
    app does not know the task (a dashboard run from a bare broker URL)."""
    return named(app, m.name, m.args, m.kwargs)


def named(app: App, task: str, args: list[Any], kwargs: dict[str, Any]) -> Arguments:
    """``arguments`` of a call of the task named ``task`` (a durable run's
    inputs: its hidden task ``dw.wf:NAME`` has the workflow's signature)."""
    found = app.tasks.get(task)
    if found is None:
        return Arguments(_unnamed(args, kwargs), "keywords")
    sig: inspect.Signature = found.signature
    try:
        bound = sig.bind(*args, **kwargs)
    except TypeError as exc:
        return Arguments(_unnamed(args, kwargs), "mismatch", str(exc))
    rows: list[Arg] = []
    for p in sig.parameters.values():
        if p.name not in bound.arguments:
            if p.default is not inspect.Parameter.empty:
                rows.append(Arg(p.name, _plain(p.default), "default"))
            continue
        value = bound.arguments[p.name]
        if p.kind is p.VAR_POSITIONAL:
            rows += [Arg(f"{p.name}[{i}]", v, "extra") for i, v in enumerate(value)]
        elif p.kind is p.VAR_KEYWORD:
            rows += [Arg(k, v, "extra") for k, v in value.items()]
        else:
            rows.append(Arg(p.name, value))
    return Arguments(rows, "signature")


def _unnamed(args: list[Any], kwargs: dict[str, Any]) -> list[Arg]:
    return [Arg(None, v) for v in args] + [Arg(k, v) for k, v in kwargs.items()]


def _plain(value: Any) -> Any:
    """A default as the page can show it (JSON-like values as they are)."""
    if value is None or isinstance(value, (str, int, float, bool, list, dict)):
        return value
    return repr(value)


def by_name(app: App, m: Message) -> dict[str, Any]:
    """The arguments a search by ``name=value`` can address: every named one
    (passed, not defaults), or the keyword arguments when no signature fits."""
    return {a.name: a.value for a in arguments(app, m).rows if a.name and a.note != "default"}


@dataclass(frozen=True, slots=True)
class Timing:
    """The times the job page shows (epoch seconds; None: not known)."""

    #: when the current (running) or last finished attempt started
    started: float | None = None
    #: when that attempt ended
    finished: float | None = None
    #: finished - started, or now - started while it runs
    took: float | None = None
    #: when the next attempt (a retry) or the first (scheduled) is due
    next_run: float | None = None
    #: "running for", "took", "last attempt took"
    label: str = ""


def timing(info: JobInfo, now: float) -> Timing:
    m = info.message
    last = m.errors[-1] if m.errors else None
    failed = (
        (last.started or None, last.time) if last is not None and last.started else (None, None)
    )
    if info.state is State.RUNNING:
        # it entered ``running`` when its worker fetched it (a prefetched job
        # waits a few milliseconds more before its handler starts)
        start = info.updated_at
        return Timing(start, None, now - start if start else None, None, "running for")
    if info.state is State.SUCCEEDED:
        done = info.outcome()
        s, f = done.get("started"), done.get("finished")
        if isinstance(s, (int, float)) and isinstance(f, (int, float)) and s:
            return Timing(float(s), float(f), float(f) - float(s), None, "took")
        return Timing(None, info.updated_at, None, None, "")
    if info.state is State.RETRYING:
        s, f = failed
        return Timing(s, f, f - s if s and f else None, info.run_at, "last attempt took")
    if info.state is State.DEAD:
        s, f = failed
        return Timing(s, f, f - s if s and f else None, None, "last attempt took")
    if info.state is State.SCHEDULED:
        return Timing(None, None, None, info.run_at, "")
    s, f = failed  # ready again after a failure, or cancelled
    return Timing(s, f, f - s if s and f else None, None, "last attempt took" if s else "")
