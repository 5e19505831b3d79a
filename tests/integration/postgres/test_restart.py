"""Surviving the server: every connection of the broker is ended mid-run.

Restarting the shared PostgreSQL server would disturb everyone using it, so
the test does to the broker what a restart does to it: it ends every backend
whose ``application_name`` is this test's own schema (a worker process, the
producer's pool, the LISTEN connections), from a separate connection, three
times while a worker drains and a producer keeps enqueuing.  Then every job
whose enqueue returned must succeed: nothing committed is lost, the worker
reconnects by itself, and no producer call fails.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import psycopg

import dumbwaiter as dw
from dumbwaiter.brokers.base import JobFilter
from dumbwaiter.state import State
from tests.crash import crashapp
from tests.integration.postgres import server

ROOT = Path(__file__).resolve().parents[3]


def _wait(cond: Callable[[], bool], what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def _started(log: Path) -> int:
    return len(log.read_text().splitlines()) if log.exists() else 0


def _terminate(application_name: str) -> int:
    """End every backend of this test (never anyone else's); how many there were."""
    with psycopg.connect(server.SERVER, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE application_name = %s AND pid <> pg_backend_pid()",
            (application_name,),
        ).fetchall()
    return len(rows)


def _succeeded(app: dw.App) -> set[str]:
    async def go() -> set[str]:
        ids: set[str] = set()
        cursor = None
        while True:
            page = await app.broker.list_jobs(JobFilter(state=State.SUCCEEDED), cursor, 1000)
            ids |= {i.message.id for i in page.items}
            if page.cursor is None:
                return ids
            cursor = page.cursor

    return asyncio.run(go())


def test_workers_and_producers_reconnect_after_their_backends_are_ended(
    schema: str, tmp_path: Path
) -> None:
    url = server.url(schema)
    log = tmp_path / "started.log"
    path = os.pathsep.join([str(ROOT / "src"), str(ROOT)])
    env = {**os.environ, "DW_CRASH_URL": url, "DW_CRASH_LOG": str(log), "PYTHONPATH": path}
    app = dw.App(url)
    work = app.task(name="crash.work")(crashapp.work.fn)
    enqueued: list[str] = [j.id for j in work.enqueue_many(range(1500))]

    stop = threading.Event()
    failures: list[BaseException] = []

    def produce() -> None:  # one job at a time and small batches, until told to stop
        i = 0
        while not stop.is_set():
            try:
                if i % 2:
                    enqueued.append(work.enqueue(i).id)
                else:
                    enqueued.extend(j.id for j in work.enqueue_many(range(i, i + 5)))
            except BaseException as exc:  # a producer call must not fail
                failures.append(exc)
                return
            i += 1
            time.sleep(0.002)

    cmd = [
        sys.executable, "-m", "dumbwaiter", "worker", "--app", "tests.crash.crashapp:app",
        "-c", "16", "--lease", "5", "--heartbeat", "1", "--log-level", "error",
    ]  # fmt: skip
    worker = subprocess.Popen(cmd, cwd=ROOT, env=env)
    producer = threading.Thread(target=produce, daemon=True)
    producer.start()
    try:
        ended = 0
        for threshold in (300, 700, 1100):
            _wait(
                lambda t=threshold: _started(log) >= t or worker.poll() is not None,  # type: ignore[misc]
                f"{threshold} jobs to start",
            )
            assert worker.poll() is None, "the worker exited"
            ended += _terminate(schema)
        assert ended >= 3 * 2  # each time at least the worker's and the producer's
        _wait(lambda: len(enqueued) > 1700, "the producer to carry on after the last cut")
        stop.set()
        producer.join(timeout=60)
        assert not failures, f"a producer call failed: {failures[0]!r}"
        total = set(enqueued)
        _wait(lambda: total <= _succeeded(app), "every enqueued job to succeed", timeout=120)
        assert worker.poll() is None  # it reconnected; nobody restarted it
    finally:
        stop.set()
        worker.send_signal(signal.SIGTERM)
        code = worker.wait(timeout=60)
        app.close()
    assert code == 0
