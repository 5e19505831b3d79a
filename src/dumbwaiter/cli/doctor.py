"""``dumbwaiter doctor``: check the app against the anti-patterns; exit 1 on problems."""

from __future__ import annotations

import click
from rich.text import Text

from ..doctor import PROBLEM, check, problems
from .common import app_option, require_app
from .output import console, plural, print_json


@click.command()
@app_option
@click.option("--json", "as_json", is_flag=True, help="Print JSON for machines.")
def doctor(app_spec: str | None, as_json: bool) -> None:
    """Check the app's tasks, groups, retries and alerts against the known
    anti-patterns, and say what to change.  Exit status 1 when a problem
    (not a note) is found, so CI can run it."""
    app = require_app(app_spec)
    found = check(app)
    bad = problems(found)
    if as_json:
        print_json({"ok": not bad, "findings": [f.to_dict() for f in found]})
        raise SystemExit(1 if bad else 0)
    out = console()
    if not found:
        out.print(Text("no problems found", style="green"))
        return
    for f in found:
        head = Text(f"{f.code} ", style="bold")
        head.append(f.level, style="red bold" if f.level == PROBLEM else "yellow")
        head.append(f"  {f.subject}: ", style="bold")
        head.append(f.message)
        out.print(head)
        out.print(Text(f"    fix: {f.fix}", style="dim"))
    notes = len(found) - len(bad)
    summary = f"{plural(len(bad), 'problem')}, {plural(notes, 'note')}"
    out.print(Text(summary, style="red bold" if bad else "green"))
    raise SystemExit(1 if bad else 0)
