"""The app the scheduler's CLI and process tests use: ``tests.apps.schedapp:app``.

Built at each lookup of ``app`` (like ``cliapp``), so every test (and every
process it starts) gets its App on the URL in ``$SCHEDAPP_URL``.
``heartbeat`` fires every second and records each run in ``$SCHEDAPP_LOG``
(one ``O_APPEND`` write per run, atomic between processes): the tick's key,
the scheduler that enqueued it, the job id, and when the job was enqueued.
"""

from __future__ import annotations

import os

import dumbwaiter as dw

URL_ENV = "SCHEDAPP_URL"
LOG_ENV = "SCHEDAPP_LOG"


def heartbeat(ctx: dw.Context) -> None:
    periodic = ctx.headers.get("periodic") or {}
    m = ctx.message
    line = f"{m.key or '-'} {periodic.get('by', '-')} {m.id} {m.created_at}\n"
    fd = os.open(os.environ.get(LOG_ENV, os.devnull), os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


def report(kind: str, *, days: int = 1) -> None:
    """A task with arguments, scheduled twice."""


def create_app() -> dw.App:
    app = dw.App(os.environ[URL_ENV])
    app.periodic(cron="* * * * * *")(heartbeat)  # every second (seconds are the 6th field)
    task = app.task(report)
    app.periodic(cron="0 3 * * *", tz="Asia/Taipei", args=("daily",), name="daily-report")(task)
    app.periodic(
        cron="0 4 * * 1", args=("weekly",), kwargs={"days": 7}, name="weekly-report", missed="once"
    )(task)
    return app


def __getattr__(name: str) -> dw.App:
    """``tests.apps.schedapp:app``: a fresh App from ``create_app`` at each lookup.

    The CLI calls nothing it finds behind ``--app``, so the per-test App
    comes from this module's own attribute lookup instead.
    """
    if name == "app":
        return create_app()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
