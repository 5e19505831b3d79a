"""How the admin commands print: rich tables for people, JSON for machines.

Two rules hold everywhere:

* ``--json`` output goes to stdout and nothing else does while it is on, so
  ``dumbwaiter jobs ls --json | jq`` always parses; notes go to stderr.
* Anything that came from a job (arguments, error messages, tracebacks) is
  printed as ``rich.text.Text``, never as a markup string, so a message that
  happens to contain ``[bold]`` or ``[/]`` is shown as written instead of being
  styled or crashing the renderer.
"""

from __future__ import annotations

import base64
import os
import re
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from datetime import datetime
from typing import Any

import click
import orjson
from rich import box
from rich.console import Console, Group, RenderableType
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from ..brokers.types import JobInfo
from ..message import ErrorRecord
from ..text import duration as duration  # the CLI's tables and the alerts read alike

#: width used when stdout is not a terminal, so piped tables do not wrap at 80
#: columns and every row stays one greppable line
PIPE_WIDTH = 200


def console(stderr: bool = False) -> Console:
    """A console on stdout (or stderr) that wraps only for real terminals.

    Rich falls back to 80 columns when the stream is not a terminal, which
    would fold every 36-character job id; ``$COLUMNS`` still wins when set.
    """
    stream = sys.stderr if stderr else sys.stdout
    width = None
    if not stream.isatty() and "COLUMNS" not in os.environ:
        width = PIPE_WIDTH
    return Console(file=stream, width=width, highlight=False, soft_wrap=False)


def print_json(value: Any) -> None:
    """``value`` as indented JSON on stdout (orjson keeps 64-bit ints and floats exact)."""
    click.echo(orjson.dumps(value, option=orjson.OPT_INDENT_2).decode())


def note(message: str) -> None:
    """A line for the person at the terminal, on stderr (never mixed into JSON)."""
    click.echo(message, err=True)


def plural(n: int, word: str, many: str | None = None) -> str:
    return f"{n} {word if n == 1 else (many or word + 's')}"


# -- time ----------------------------------------------------------------------


def took(seconds: float) -> str:
    """How long an attempt ran: ``0.8 ms``, ``42 ms``, then as ``duration``."""
    s = max(0.0, seconds)
    if s < 0.01:
        return f"{s * 1000:.1f} ms"
    if s < 1:
        return f"{s * 1000:.0f} ms"
    return duration(s)


def timestamp(t: float | None) -> str:
    """Local time with its UTC offset, to the second (``-`` when unset)."""
    if t is None:
        return "-"
    return datetime.fromtimestamp(t).astimezone().isoformat(sep=" ", timespec="seconds")


def relative(t: float | None, now: float | None = None) -> str:
    """``3m10s ago`` or ``in 20s``."""
    if t is None:
        return "-"
    delta = (now if now is not None else time.time()) - t
    return f"{duration(delta)} ago" if delta >= 0 else f"in {duration(-delta)}"


def when(t: float | None) -> str:
    """Absolute and relative together, for detail views."""
    if t is None:
        return "-"
    return f"{timestamp(t)} ({relative(t)})"


_RELATIVE = re.compile(r"(\d+(?:\.\d+)?)\s*(w|d|h|m|s)", re.IGNORECASE)
_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}


def parse_time(text: str, now: float | None = None) -> float:
    """Epoch seconds for ``--since``/``--until``.

    ``30m``, ``2h``, ``1d``, ``1h30m`` (optionally followed by ``ago``) mean that
    long before now; anything else must be ISO 8601 (``2024-05-01``,
    ``2024-05-01T12:00:00Z``).  An ISO time without an offset is local time,
    which is what a person typing it means.  Raises ``ValueError``.
    """
    s = text.strip().lower()
    s = s.removesuffix("ago").strip()
    if s and _RELATIVE.sub("", s).strip() == "":
        total = sum(float(n) * _UNITS[u.lower()] for n, u in _RELATIVE.findall(s))
        return (now if now is not None else time.time()) - total
    try:
        dt = datetime.fromisoformat(text.strip())
    except ValueError:
        raise ValueError(
            f"{text!r} is neither a relative time (30m, 2h, 1d, 1h30m) "
            "nor an ISO 8601 time (2024-05-01 or 2024-05-01T12:00:00Z)"
        ) from None
    if dt.tzinfo is None:
        dt = dt.astimezone()  # naive: local time
    return dt.timestamp()


def time_option(param_decls: str, help: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """``--since``/``--until``: a TIME (see ``parse_time``) given to the command as epoch
    seconds; a bad value is a usage error naming the option."""

    def convert(ctx: click.Context, param: click.Parameter, value: str | None) -> float | None:
        if value is None:
            return None
        try:
            return parse_time(value)
        except ValueError as exc:
            raise click.BadParameter(str(exc), ctx, param) from None

    return click.option(param_decls, metavar="TIME", callback=convert, help=help)


# -- tables ----------------------------------------------------------------------


def table(*columns: str, right: Iterable[str] = ()) -> Table:
    """A plain table: a header rule and no borders, which reads well and copies cleanly."""
    t = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, header_style="bold")
    r = set(right)
    for c in columns:
        t.add_column(c, justify="right" if c in r else "left", no_wrap=c in ("id", "ID"))
    return t


def one_line(s: str, limit: int = 80) -> str:
    """The first line of a message, shortened for a table cell."""
    first = s.strip().splitlines()[0] if s.strip() else ""
    return first if len(first) <= limit else first[: limit - 1] + "…"


def error_label(e: ErrorRecord) -> str:
    return f"{e.type}: {one_line(e.message, 60)}" if e.message else e.type


# -- one job ---------------------------------------------------------------------


def job_dict(info: JobInfo) -> dict[str, Any]:
    """The JSON form of a stored job: the envelope with every error, plus where it is.

    A body that could not be decoded is kept as ``raw`` text, so an export of
    the dead-letter queue loses nothing.
    """
    d = info.to_dict()
    if info.raw is not None:
        d.update(raw_fields(info.raw))
    return d


def raw_fields(raw: bytes) -> dict[str, str]:
    """An undecodable body in JSON: ``raw`` text when it is UTF-8, else
    ``raw_base64``, so the bytes come back exactly as they were stored."""
    try:
        return {"raw": raw.decode("utf-8")}
    except UnicodeDecodeError:
        return {"raw_base64": base64.b64encode(raw).decode("ascii")}


def raw_text(raw: bytes) -> tuple[str, bool]:
    """An undecodable body for people, and whether it is UTF-8 (when it is
    not, each byte that is not part of UTF-8 text is shown as ``\\xNN``)."""
    try:
        return raw.decode("utf-8"), True
    except UnicodeDecodeError:
        return raw.decode("utf-8", "backslashreplace"), False


def _json_text(value: Any) -> Text:
    return Text(orjson.dumps(value).decode())


def _result_text(raw: bytes) -> Text:
    # the worker stores {"value": ...}, or {"error": ...} when the value was not JSON
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return Text(raw.decode("utf-8", "replace"))
    if isinstance(value, dict) and "value" in value:
        return _json_text(value["value"])
    if isinstance(value, dict) and "error" in value:
        return Text(f"not stored: {value['error']}")
    return _json_text(value)


def _fields(info: JobInfo) -> Table:
    m = info.message
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold", no_wrap=True)
    grid.add_column()
    rows: list[tuple[str, Text]] = [
        ("id", Text(m.id)),
        ("task" if m.kind == "task" else "event", Text(m.name)),
        ("queue", Text(m.queue)),
        ("state", Text(str(info.state))),
        ("attempt", Text(f"{m.attempt} of {m.max_attempts}")),
        ("priority", Text(str(m.priority))),
        ("key", Text(m.key if m.key is not None else "-")),
        ("created", Text(when(m.created_at or None))),
        ("eta", Text(when(m.eta))),
        ("run at", Text(when(info.run_at))),
        ("updated", Text(when(info.updated_at))),
        ("worker", Text(info.worker or "-")),
    ]
    if info.lease_until is not None:
        rows.append(("lease until", Text(when(info.lease_until))))
    done = info.outcome()
    started, finished = done.get("started"), done.get("finished")
    if isinstance(started, (int, float)) and isinstance(finished, (int, float)) and started:
        rows.append(("took", Text(f"{took(finished - started)} (started {when(started)})")))
    rows.append(("replays", Text(str(info.replays))))
    if info.compact:
        rows.append(("args", Text("not kept once it succeeded", style="dim")))
    elif m.payload is not None:
        rows.append(("payload", _json_text(m.payload)))
    else:
        rows.append(("args", _json_text(m.args)))
        rows.append(("kwargs", _json_text(m.kwargs)))
    if not info.compact:
        rows.append(("headers", _json_text(m.headers)))
    if info.result is not None and ("value" in done or "error" in done):
        rows.append(("result", _result_text(info.result)))
    if info.raw is not None:
        text, utf8 = raw_text(info.raw)
        label = "raw body" if utf8 else "raw body (not UTF-8: bytes as \\xNN)"
        rows.append((label, Text(text)))
    for k, v in rows:
        grid.add_row(k, v)
    return grid


def _error_panel(i: int, e: ErrorRecord) -> Panel:
    head = Table.grid(padding=(0, 2))
    head.add_column(style="bold", no_wrap=True)
    head.add_column()
    head.add_row("time", Text(when(e.time or None)))
    head.add_row("type", Text(e.type, style="bold red"))
    head.add_row("message", Text(e.message))
    head.add_row("worker", Text(e.worker or "-"))
    parts: list[RenderableType] = [head]
    if e.traceback:
        parts += [Text(""), Text(e.traceback.rstrip("\n"), style="dim")]
    title = f"error {i}" + (f" · attempt {e.attempt}" if e.attempt else "")
    return Panel(Group(*parts), title=title, title_align="left", box=box.ROUNDED, expand=False)


def _errors(errors: Sequence[ErrorRecord]) -> list[RenderableType]:
    if not errors:
        return [Text("no errors recorded", style="dim")]
    return [_error_panel(i, e) for i, e in enumerate(errors, 1)]


def render_job(info: JobInfo, *, dead_letter: bool = False) -> None:
    """``jobs show``: the envelope first, then every error.  ``dlq show``: a
    one-line verdict and the attempts' errors first (that is what a person
    opening a dead letter came for), then the envelope."""
    out = console()
    m = info.message
    errors = m.errors
    if dead_letter:
        last = errors[-1] if errors else None
        verdict = Text(f"dead letter {m.id}", style="bold")
        verdict.append(f"  {m.name} on {m.queue}, died {relative(info.updated_at)}")
        verdict.append(f" after {plural(len(errors), 'failed attempt')}")
        if last is not None:
            verdict.append("\nlast error: ")
            verdict.append(error_label(last), style="red")
        out.print(verdict)
        out.print()
        out.print(Text(f"Attempts ({len(errors)})", style="bold underline"))
        for r in _errors(errors):
            out.print(r)
        out.print()
        out.print(Text("Envelope", style="bold underline"))
        out.print(_fields(info))
        return
    out.print(Text(f"Job {m.id}", style="bold"))
    out.print(_fields(info))
    out.print()
    out.print(Text(f"Errors ({len(errors)})", style="bold underline"))
    for r in _errors(errors):
        out.print(r)
