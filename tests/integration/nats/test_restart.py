"""A NATS server restart mid-run: workers and producers reconnect and carry on.

A nats-server of the test's own (JetStream, file storage) serves a worker
process working through jobs while a producer keeps enqueueing one job at a
time.  The server is stopped mid-run (SIGTERM: a clean shutdown; SIGKILL: a
crash of the process, not of the machine: what it wrote is in the page
cache) and started again on the same port and storage directory.  Every job
enqueued before the restart, and every job whose enqueue returned around it
(an enqueue retries with backoff while the server is down), runs; the worker
survives and stops cleanly.
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

import pytest

import dumbwaiter as dw
from tests.crash import crashapp

from .conftest import NatsServer

ROOT = Path(__file__).resolve().parents[3]
N = 1500


def _wait(cond: Callable[[], bool], what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def _started(log: Path) -> list[str]:
    return [line.split()[0] for line in log.read_text().splitlines()] if log.exists() else []


def _succeeded(app: dw.App) -> int:
    async def go() -> int:
        return sum(s.succeeded for s in await app.broker.stats())

    try:
        return asyncio.run(go())
    except dw.errors.BrokerError:  # the server is still starting
        return -1
    finally:
        asyncio.run(app.broker.close())


@pytest.mark.parametrize("how", [signal.SIGTERM, signal.SIGKILL], ids=["sigterm", "sigkill"])
def test_worker_and_producer_carry_on_over_a_restart(
    nats_server: NatsServer, tmp_path: Path, how: signal.Signals
) -> None:
    url = nats_server.url(prefix="restart", reconnect="60")
    log = tmp_path / "started.log"
    env = {**os.environ, "DW_CRASH_URL": url, "DW_CRASH_LOG": str(log), "PYTHONPATH": str(ROOT)}
    app = dw.App(url)
    work = app.task(name="crash.work")(crashapp.work.fn)
    before = {j.id for j in work.enqueue_many(range(N))}

    worker = subprocess.Popen(
        [
            sys.executable, "-m", "dumbwaiter", "worker", "--app", "tests.crash.crashapp:app",
            "-c", "16", "--lease", "10", "--heartbeat", "1", "--log-level", "warning",
        ],
        cwd=ROOT,
        env=env,
    )  # fmt: skip
    during: list[str] = []
    producing = threading.Event()
    stop_producing = threading.Event()

    def produce() -> None:
        """One job at a time, straight through the restart: each enqueue
        waits (retrying with backoff) until the server answers again."""
        i = N
        while not stop_producing.is_set():
            during.append(work.enqueue(i).id)
            producing.set()
            i += 1
            time.sleep(0.005)

    producer = threading.Thread(target=produce)
    try:
        _wait(lambda: len(_started(log)) >= N // 3, "a third of the jobs to start")
        producer.start()
        assert producing.wait(10)
        nats_server.stop(how)
        time.sleep(0.5)  # the server stays down a while: nothing to wait on
        nats_server.start()
        count = len(during)
        _wait(lambda: len(during) > count + 20, "the producer to enqueue again after the restart")
        stop_producing.set()
        producer.join(timeout=60)
        total = N + len(during)
        _wait(lambda: _succeeded(app) == total, "every job to succeed", timeout=120)
        assert worker.poll() is None, "the worker must survive the restart"
    finally:
        stop_producing.set()
        if producer.is_alive():
            producer.join(timeout=60)
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(timeout=30) == 0  # graceful stop exits cleanly
        app.close()

    ran = set(_started(log))
    assert before <= ran  # every job enqueued before the restart ran
    assert set(during) <= ran  # and every one enqueued around it
    assert len(set(during)) == len(during)
