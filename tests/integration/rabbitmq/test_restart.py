"""Surviving the server: every connection of the test is closed mid-run.

The shared RabbitMQ must not be restarted (others use it), and its management
API may be off, so the test does to the broker what a restart does to its
clients: ``rabbitmqctl close_connection`` ends every AMQP connection whose
name carries this test's prefix (the worker process's, the producer's), from
the server side, three times while a worker drains and a producer keeps
enqueuing.  Then every job whose enqueue returned must succeed: nothing
confirmed is lost, the worker reconnects by itself, and no producer call
fails.

What it does not show: a real restart also loses unconfirmed publishes in
flight and takes the queues away for a while (a quorum queue's leader is
re-elected, a classic priority lane is read back from disk).  The producer's
retry window (``reconnect=``, 30 s) and the worker's back-off cover that
time; the durability of confirmed messages across a restart is RabbitMQ's
own (quorum queues fsync before they confirm), which this test cannot
exercise without restarting the server.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import dumbwaiter as dw
from dumbwaiter.brokers.base import JobFilter
from dumbwaiter.state import State
from tests.conftest import require_service
from tests.crash import crashapp
from tests.integration.rabbitmq import server

ROOT = Path(__file__).resolve().parents[3]
CTL = shutil.which("rabbitmqctl") or "/usr/sbin/rabbitmqctl"


def _wait(cond: Callable[[], bool], what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def _started(log: Path) -> int:
    return len(log.read_text().splitlines()) if log.exists() else 0


def _close_connections(prefix: str) -> int:
    """Close every connection named for ``prefix`` (never anyone else's)."""
    out = subprocess.run(
        [CTL, "-q", "list_connections", "pid", "client_properties"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    mine = [line.split()[0] for line in out.splitlines() if f"dumbwaiter {prefix} " in line]
    for pid in mine:
        subprocess.run(
            [CTL, "-q", "close_connection", pid, "dumbwaiter restart test"],
            capture_output=True,
            timeout=60,
            check=False,
        )
    return len(mine)


def _succeeded(app: dw.App) -> set[str]:
    async def go() -> set[str]:
        ids: set[str] = set()
        cursor = None
        while True:
            page = await app.broker.list_jobs(JobFilter(state=State.SUCCEEDED), cursor, 5000)
            ids |= {i.message.id for i in page.items}
            if page.cursor is None:
                return ids
            cursor = page.cursor

    return asyncio.run(go())


def test_workers_and_producers_reconnect_after_their_connections_close(tmp_path: Path) -> None:
    if not os.path.exists(CTL):
        require_service("rabbitmqctl", False, f"{CTL} is needed to close the test's connections")
    prefix = server.new_prefix()
    url = server.url(prefix, f"sqlite:///{tmp_path}/state.db")
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
        closed = 0
        for threshold in (300, 700, 1100):
            _wait(
                lambda t=threshold: _started(log) >= t or worker.poll() is not None,  # type: ignore[misc]
                f"{threshold} jobs to start",
            )
            assert worker.poll() is None, "the worker exited"
            closed += _close_connections(prefix)
        assert closed >= 3 * 2  # each time at least the worker's and the producer's
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
