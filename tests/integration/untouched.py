"""Run a check in a fresh interpreter that snapshots a client library's
modules and classes before dumbwaiter is imported: the isolation tests of
the brokers with private hooks (brokers/hooks.py) use it to prove nothing of
the library was replaced."""

from __future__ import annotations

import os
import subprocess
import sys

#: ``snapshot(owners)`` of ``{label: module or class}``; ``changed(before,
#: after)``: the names whose object is not the same one any more;
#: ``one_job(url)``: an App on ``url`` that enqueued and fetched a job (the
#: broker's send and receive paths, hooks and all)
PRELUDE = r"""
def snapshot(owners):
    return {label: dict(vars(owner)) for label, owner in owners.items()}


def changed(before, after):
    return sorted(
        f"{label}.{name}"
        for label in before
        for name in set(before[label]) | set(after[label])
        if before[label].get(name) is not after[label].get(name)
    )


async def one_job(url):
    import dumbwaiter as dw

    app = dw.App(url)

    @app.task(name="isolation.noop")
    async def noop(i: int) -> None:
        pass

    job = await noop.aenqueue(1)
    got = await app.broker.fetch(["default"], 1, 30.0, 10.0)
    assert [d.id for d in got] == [job.id], got
    return app
"""


def run_fresh(script: str, *args: str) -> None:
    """Run ``PRELUDE`` + ``script`` with the hooks on; it must print ``ok``."""
    env = {k: v for k, v in os.environ.items() if k != "DUMBWAITER_HOOKS_OFF"}
    done = subprocess.run(
        [sys.executable, "-c", PRELUDE + script, *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=90,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "ok"
