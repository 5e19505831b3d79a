"""What the workflow pages show of a durable run, worked out from what
``durable.admin`` returns (``describe``, ``list_runs``): the timeline's rows
with their place on one time axis, and what the run waits for.

Nothing here reads the broker or decides anything about a run: the reads,
the statuses and the actions are ``durable.admin``'s, as for ``dumbwaiter
workflows``.  This module only lays them out for the page.

Some operations store no start time: a wait for an event and a child run
record when they ended (``t1``) only.  The run reached such an operation
when the operation before it ended (the code between operations takes no
time worth showing), so that is where its bar starts and what its "waited"
counts from.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

#: statuses a run does not leave
FINAL = frozenset({"succeeded", "failed", "cancelled"})
#: operations that take no time of their own (values the replay keeps)
INSTANT = frozenset({"now", "uuid", "patch"})


@dataclass(frozen=True, slots=True)
class Waiting:
    """What a run that has not ended waits for (the record's ``waiting``)."""

    #: "sleep", "event", "child", "retry", "compensate", "version"
    kind: str
    #: the operation's name (a step, a sleep, a wait...)
    name: str
    #: when the wait ends by itself (a sleep's wake, an event's timeout, a retry)
    until: float | None = None
    #: an event wait: the type and the payload fields it matches
    event: str | None = None
    match: dict[str, Any] = field(default_factory=dict)
    #: a child wait: the child run and its workflow
    child: str | None = None
    child_workflow: str | None = None
    #: a retry wait: the attempt that comes next
    attempt: int | None = None

    @property
    def summary(self) -> str:
        """One line, for the runs list."""
        if self.kind == "sleep":
            return f"sleep {self.name!r}"
        if self.kind == "event":
            cond = ", ".join(f"{k}={v!r}" for k, v in self.match.items())
            return f"event {self.event}" + (f" ({cond})" if cond else "") + f" at {self.name!r}"
        if self.kind == "child":
            return f"child run {self.child} at {self.name!r}"
        if self.kind == "retry":
            return f"retry of {self.name!r} (attempt {self.attempt})"
        if self.kind == "compensate":
            return f"retry of the compensation of {self.name!r}"
        if self.kind == "version":
            return self.name
        return f"{self.kind} {self.name!r}"


def waiting(rec: dict[str, Any]) -> Waiting | None:
    """What ``rec`` (a run record, or ``describe``'s answer) waits for; None
    for a run that has ended or waits for nothing (it runs, or is due)."""
    w = rec.get("waiting")
    if not isinstance(w, dict) or not w.get("kind") or rec.get("status") in FINAL:
        return None
    wake = rec.get("wake_at")
    attempt = w.get("attempt")
    match = w.get("match")
    return Waiting(
        kind=str(w["kind"]),
        name=str(w.get("name") or ""),
        until=float(wake) if isinstance(wake, int | float) else None,
        event=str(w["event"]) if w.get("event") else None,
        match=dict(match) if isinstance(match, dict) else {},
        child=str(w["run"]) if w.get("run") else None,
        child_workflow=str(w["workflow"]) if w.get("workflow") else None,
        attempt=int(attempt) if isinstance(attempt, int) else None,
    )


@dataclass(frozen=True, slots=True)
class Bar:
    """A row's span on the run's time axis, in percent of the axis."""

    x: float
    width: float
    #: the span goes on (a sleep or a wait under way)
    open: bool = False


@dataclass(slots=True)
class Row:
    """One operation of the timeline."""

    #: the position as shown: "3", or "undo 2" for the compensation of step 2
    pos: str
    name: str
    #: "step", "sleep", "event", "child", "compensate", "now", "uuid", "patch",
    #: "retrying" (a step between attempts), or "waiting" (the wait under way)
    kind: str
    #: "done", "failed", "timed out", "sleeping", "retrying", "waiting"
    status: str
    started: float | None = None
    finished: float | None = None
    #: seconds it ran (a step) or waited (a sleep, an event, a child)
    took: float | None = None
    #: "ran", "waited" or "slept": what ``took`` measures
    took_label: str = ""
    attempts: int | None = None
    has_output: bool = False
    output: Any = None
    error: dict[str, Any] | None = None
    #: a sleep's wake time; a wait's deadline
    until: float | None = None
    child: str | None = None
    #: a step between attempts: when the next is due, its failed attempts
    next_attempt_at: float | None = None
    errors: list[dict[str, Any]] = field(default_factory=list)
    bar: Bar | None = None


@dataclass(slots=True)
class Timeline:
    rows: list[Row]
    #: the axis: from the run's start to its end (or now)
    start: float | None
    end: float | None

    @property
    def span(self) -> float | None:
        if self.start is None or self.end is None:
            return None
        return max(self.end - self.start, 0.0)


def timeline(run: dict[str, Any], now: float) -> Timeline:
    """The rows of ``describe(run)``'s ``steps`` in order, and, for a run
    parked at an event or a child (which has no checkpoint until it ends),
    a last row for that wait."""
    start = _num(run.get("created_at"))
    end = _num(run.get("finished_at")) if run.get("status") in FINAL else now
    rows: list[Row] = []
    reached = start  # when the run got to the next operation
    for s in run.get("steps") or []:
        row = _row(s, reached, now)
        rows.append(row)
        if row.kind not in ("retrying", "compensate") and row.finished is not None:
            reached = row.finished
    w = waiting(run)
    if w is not None and w.kind in ("event", "child"):
        rows.append(
            Row(
                pos="",
                name=w.name,
                kind="waiting",
                status="waiting",
                started=reached,
                took=now - reached if reached is not None else None,
                took_label="waiting for",
                until=w.until,
                child=w.child,
            )
        )
    if start is not None and end is not None:
        span = max(end - start, 1e-9)
        for row in rows:
            row.bar = _bar(row, start, span, now)
    return Timeline(rows, start, end)


def _row(s: dict[str, Any], reached: float | None, now: float) -> Row:
    kind = str(s.get("kind") or "")
    status = str(s.get("status") or "")
    pos = str(s.get("pos") or "")
    shown = f"undo {int(pos[1:])}" if pos.startswith("c") and pos[1:].isdigit() else pos
    if shown.isdigit():
        shown = str(int(shown))
    t0, t1 = _num(s.get("started_at")), _num(s.get("finished_at"))
    error = s.get("error") if isinstance(s.get("error"), dict) else None
    row = Row(
        pos=shown,
        name=str(s.get("name") or ""),
        kind=kind,
        status=status,
        started=t0,
        finished=t1,
        attempts=s.get("attempts") if isinstance(s.get("attempts"), int) else None,
        error=error,
        child=str(s["child"]) if s.get("child") else None,
    )
    if kind == "retrying":
        row.next_attempt_at = _num(s.get("next_attempt_at"))
        row.errors = [e for e in s.get("errors") or [] if isinstance(e, dict)]
        return row
    if kind == "sleep":
        row.until = _num(s.get("until"))
        if row.started is not None and row.until is not None:
            row.finished = min(row.until, now) if status == "sleeping" else row.until
            row.took, row.took_label = row.finished - row.started, "slept"
        return row
    if kind in ("event", "child"):
        row.started = reached
        if reached is not None and t1 is not None:
            row.took, row.took_label = t1 - reached, "waited"
    elif t0 is not None and t1 is not None:
        row.took, row.took_label = t1 - t0, "ran"
    if error is None and "output" in s and kind not in ("patch", "compensate"):
        row.has_output, row.output = True, s.get("output")
    return row


def _bar(row: Row, start: float, span: float, now: float) -> Bar | None:
    if row.kind == "retrying" or row.kind in INSTANT:
        return None
    a = row.started if row.started is not None else row.finished
    if a is None:
        return None
    b = row.finished if row.finished is not None else now
    x = min(max((a - start) / span * 100.0, 0.0), 100.0)
    width = min(max((b - a) / span * 100.0, 0.0), 100.0 - x)
    return Bar(round(x, 2), round(width, 2), open=row.status in ("sleeping", "waiting"))


def _num(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) else None


def retryable(run: dict[str, Any], job_dead: bool) -> bool:
    """Whether the page offers Retry: what ``admin.retry_run`` takes (a failed
    run whose compensations did not run, or one whose job died); the action
    still asks ``retry_run``, which refuses anything else with the reason."""
    if run.get("status") == "failed":
        return not run.get("compensated")
    return run.get("status") not in FINAL and job_dead
