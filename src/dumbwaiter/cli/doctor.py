"""``dumbwaiter doctor``: check the app and its broker; exit 1 on faults only."""

from __future__ import annotations

import click
from rich.text import Text

from ..doctor import (
    FAULT,
    LEVELS,
    WARNING,
    Finding,
    check,
    check_broker,
    faults,
    host_scope,
    ordered,
)
from .admin import call
from .common import app_option, require_app
from .output import console, plural, print_json

_STYLE = {FAULT: "red bold", WARNING: "yellow", "note": "cyan"}


@click.command()
@app_option
@click.option(
    "--no-broker",
    is_flag=True,
    help="Check the configuration only, without asking the broker (for CI).",
)
@click.option(
    "--timeout",
    type=click.FloatRange(min=0.1),
    default=10.0,
    show_default=True,
    help="Seconds the broker has to answer before it counts as unreachable.",
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON for machines.")
def doctor(app_spec: str | None, no_broker: bool, timeout: float, as_json: bool) -> None:
    """Check the app against the known anti-patterns, and its broker, and say
    what to change.

    Each finding is a fault (something does not work: the broker cannot be
    reached or is not ready), a warning (it works but can hurt) or a note
    (advice).  Exit status 1 when there is a fault, else 0, so CI can run it;
    --json lists every finding with its level.  The first line says where the
    app's processes may run: on several machines (multi-host), or on one.
    """
    app = require_app(app_spec)
    found = check(app)
    if not no_broker:
        found = ordered(found + call(app, lambda _: check_broker(app, timeout)))
    bad = faults(found)
    if as_json:
        counts = {level: sum(f.level == level for f in found) for level in LEVELS}
        print_json(
            {
                "ok": not bad,
                "multi_host": app.broker.capabilities.multi_host,
                "scope": host_scope(app),
                "counts": counts,
                "findings": [f.to_dict() for f in found],
            }
        )
        raise SystemExit(1 if bad else 0)
    console().print(Text(f"deployment: {host_scope(app)}", style="bold"))
    _print(found)
    raise SystemExit(1 if bad else 0)


def _print(found: list[Finding]) -> None:
    out = console()
    if not found:
        out.print(Text("nothing found: no faults, no warnings", style="green"))
        return
    for f in found:
        head = Text(f"{f.code} ", style="bold")
        head.append(f"{f.level:<7}", style=_STYLE.get(f.level, ""))
        head.append(f"  {f.subject}: ", style="bold")
        head.append(f.message)
        out.print(head)
        out.print(Text(f"    fix: {f.fix}", style="dim"))
    n = {level: sum(f.level == level for f in found) for level in LEVELS}
    summary = ", ".join(plural(n[level], level) for level in LEVELS)
    if n[FAULT]:
        out.print(Text(f"{summary}: the faults need fixing", style="red bold"))
    else:
        out.print(Text(f"{summary}: no faults (warnings and notes are advice)", style="green"))
