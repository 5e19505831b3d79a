"""Crash safety of deliveries: a worker killed with SIGKILL mid-delivery
loses no webhook, and a webhook sent again carries the same webhook-id.

300 deliveries to a real receiver (uvicorn on loopback) that takes 50 ms
per request, so the kill finds requests in flight.  The worker is killed
once a third have arrived, and restarted.  At the end every webhook-id has
arrived at least once with a valid signature, every delivery job
succeeded, and the only webhook-ids that arrived twice are those of the
deliveries the killed worker held."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

import dumbwaiter as dw
from dumbwaiter.brokers.types import JobFilter
from dumbwaiter.state import State
from dumbwaiter.webhooks import verify
from tests.brokers import BROKERS, CROSS_PROCESS
from tests.waiting import wait_until

from .crashhooks import SETTINGS
from .receiver import Receiver, serve

ROOT = Path(__file__).resolve().parents[2]
N = 300
pytestmark = [pytest.mark.crash, pytest.mark.timeout(420)]


@contextlib.contextmanager
def _killed_on_failure(proc: subprocess.Popen[bytes]) -> Iterator[None]:
    try:
        yield
    except BaseException:
        proc.kill()
        proc.wait(timeout=10)
        raise


def _running(app: dw.App) -> set[str]:
    async def go() -> set[str]:
        ids: set[str] = set()
        cursor = None
        while True:
            page = await app.broker.list_jobs(JobFilter(state=State.RUNNING), cursor, 500)
            ids |= {i.message.id for i in page.items}
            if page.cursor is None:
                return ids
            cursor = page.cursor

    return asyncio.run(go())


@pytest.mark.parametrize("broker", CROSS_PROCESS)
def test_sigkill_mid_delivery_every_webhook_lands_with_its_id(broker: str, tmp_path: Path) -> None:
    url = BROKERS[broker](tmp_path)
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    env = {**os.environ, "DW_CRASH_URL": url, "PYTHONPATH": path}
    cmd = [
        sys.executable, "-m", "dumbwaiter", "worker", "--app", "tests.webhooks.crashhooks:app",
        "-c", "16", "--lease", "2", "--heartbeat", "0.5", "--log-level", "WARNING",
    ]  # fmt: skip
    rec = Receiver()
    with serve(rec) as base:
        app = dw.App(url)
        app.webhooks.configure(**SETTINGS)  # as the workers' app is
        ep = app.webhooks.add_endpoint(base + "/hold", concurrency=None)
        sent = [app.webhooks.send(ep, "crash.hooked", {"i": i}) for i in range(N)]
        webhook_of = {s.job.id: s.webhook_id for s in sent}
        wanted = set(webhook_of.values())
        assert len(wanted) == N

        def arrived() -> set[str]:
            return {r.webhook_id for r in rec.requests}

        def alive(proc: subprocess.Popen[bytes]) -> bool:
            assert proc.poll() is None, f"the worker exited with {proc.returncode}"
            return True

        proc = subprocess.Popen(cmd, cwd=ROOT, env=env)
        with _killed_on_failure(proc):
            wait_until(
                lambda: alive(proc) and len(arrived()) >= N // 3,
                "a third of the webhooks to arrive",
                120,
            )
        proc.send_signal(signal.SIGKILL)
        assert proc.wait(timeout=10) == -signal.SIGKILL
        held = _running(app)
        assert held, "the kill should find deliveries in flight"

        proc = subprocess.Popen(cmd, cwd=ROOT, env=env)
        with _killed_on_failure(proc):
            wait_until(lambda: alive(proc) and arrived() >= wanted, "every webhook to arrive", 180)
            wait_until(
                lambda: asyncio.run(app.broker.stats())[0].succeeded >= N,
                "every delivery job to succeed",
                60,
            )
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0

    [stats] = [s for s in asyncio.run(app.broker.stats()) if s.queue == "webhooks"]
    assert (stats.succeeded, stats.dead, stats.ready, stats.running) == (N, 0, 0, 0)
    assert arrived() == wanted  # none lost, none invented
    for r in rec.requests:  # every copy is signed, with its own fresh timestamp
        verify(ep.secret, r.headers, r.body, tolerance=600)
    times = Counter(r.webhook_id for r in rec.requests)
    twice = {w for w, n in times.items() if n > 1}
    assert twice <= {webhook_of[j] for j in held}  # only deliveries in flight at the kill
    app.close()


@pytest.mark.parametrize("broker", CROSS_PROCESS[:1])
def test_a_worker_that_sent_webhooks_stops_cleanly(broker: str, tmp_path: Path) -> None:
    """SIGTERM after deliveries to a keep-alive receiver: the worker closes
    its pooled HTTP client on its own loop and exits 0, even with every
    warning an error (an unclosed socket, a transport closed under a
    finished loop)."""
    url = BROKERS[broker](tmp_path)
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    env = {**os.environ, "DW_CRASH_URL": url, "PYTHONPATH": path, "PYTHONWARNINGS": "error"}
    cmd = [
        sys.executable, "-m", "dumbwaiter", "worker", "--app", "tests.webhooks.crashhooks:app",
        "-c", "4", "--log-level", "WARNING",
    ]  # fmt: skip
    rec = Receiver()
    with serve(rec) as base:
        app = dw.App(url)
        app.webhooks.configure(**SETTINGS)
        ep = app.webhooks.add_endpoint(base + "/ok")
        sent = [app.webhooks.send(ep, "crash.hooked", {"i": i}) for i in range(5)]
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env)
        with _killed_on_failure(proc):
            for s in sent:
                s.job.result(timeout=60)  # raises unless delivered
            assert len(rec.requests) >= 5
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    app.close()
