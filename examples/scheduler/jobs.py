"""Periodic tasks: run one `dumbwaiter scheduler` (or `worker --with-scheduler`)
per machine, as many as you like; each tick still runs once.

    dumbwaiter worker --app jobs:app --with-scheduler     # runs jobs, and is a scheduler replica
    dumbwaiter scheduler --app jobs:app                   # one more replica (any number)
    dumbwaiter schedules ls --app jobs:app                # expression, zone, last and next run
"""

from datetime import timedelta

import dumbwaiter as dw

app = dw.App()  # embedded SQLite in ./dumbwaiter.db (or $DUMBWAITER_URL)


# A new function: @app.periodic registers the task and its schedule at once.
# (Every 2 seconds so you can watch it; aligned to the clock: :00, :02, :04...)
@app.periodic(every=timedelta(seconds=2))
def heartbeat(ctx: dw.Context) -> None:
    print("heartbeat for tick", ctx.headers["periodic"]["tick"], flush=True)


# Wall-clock time in a time zone; task options (queue, retry...) go along.
@app.periodic(cron="0 3 * * *", tz="Asia/Taipei", retry=dw.Retry(attempts=3))
def nightly_report() -> None:
    print("nightly report", flush=True)


# An existing task, scheduled twice with different arguments: each schedule
# needs its own name.  missed="once" runs one catch-up if every scheduler was
# down when a tick fell (the default, "skip", runs none).
@app.task
def cleanup(table: str, *, older_than_days: int = 30) -> None:
    print(f"cleaning {table} (older than {older_than_days} days)", flush=True)


app.periodic(cron="*/15 * * * *", args=("sessions",), name="cleanup-sessions")(cleanup)
app.periodic(
    cron="0 4 * * sun",
    tz="Europe/Paris",
    args=("audit_log",),
    kwargs={"older_than_days": 365},
    name="cleanup-audit",
    missed="once",
)(cleanup)
