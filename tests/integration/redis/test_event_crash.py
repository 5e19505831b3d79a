"""Crash safety of events on Redis: a worker killed with SIGKILL twice, while
it handles two groups' deliveries read from their consumer groups, loses
none.  Every (event, group) is handled; the only deliveries that started
twice are the ones the killed worker held at a kill."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

import dumbwaiter as dw
from dumbwaiter.brokers.types import JobFilter
from dumbwaiter.state import State
from tests.crash.test_sigkill import _killed_on_failure, _lines, _wait
from tests.integration.redis import eventcrashapp
from tests.integration.redis.server import new_prefix, url

ROOT = Path(__file__).resolve().parents[3]
N = 1000
pytestmark = pytest.mark.crash


def _running(app: dw.App) -> set[str]:
    async def go() -> set[str]:
        page = await app.broker.list_jobs(JobFilter(state=State.RUNNING), None, 1000)
        return {i.message.id for i in page.items}

    return asyncio.run(go())


def _stats(app: dw.App) -> dict[str, tuple[int, int, int, int]]:
    return {
        s.queue: (s.succeeded, s.dead, s.ready, s.running) for s in asyncio.run(app.broker.stats())
    }


def test_sigkill_twice_every_event_reaches_every_group(tmp_path: Path) -> None:
    broker_url = url(new_prefix())
    log = tmp_path / "started.log"
    env = {
        **os.environ,
        "DW_CRASH_URL": broker_url,
        "DW_CRASH_LOG": str(log),
        "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)]),  # this checkout's code
    }
    app = dw.App(broker_url)
    for group in ("mail", "books"):  # the producer binds the workers' groups

        @app.subscribe(eventcrashapp.Placed, group=group)
        def handler(event: eventcrashapp.Placed) -> None: ...

    events = {app.publish(eventcrashapp.Placed(n=i)) for i in range(N)}  # groups bound first
    assert len(events) == N

    cmd = [
        sys.executable, "-m", "dumbwaiter", "worker",
        "--app", "tests.integration.redis.eventcrashapp:app",
        "-c", "16", "--lease", "2", "--heartbeat", "0.5", "--log-level", "WARNING",
    ]  # fmt: skip
    in_flight: set[str] = set()
    for threshold in (N // 2, N):
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env)
        with _killed_on_failure(proc):
            _wait(lambda t=threshold: len(_lines(log)) >= t, f"{threshold} deliveries to start")  # type: ignore[misc]
        proc.send_signal(signal.SIGKILL)
        assert proc.wait(timeout=10) == -signal.SIGKILL
        held = _running(app)
        assert held, "the kill should find deliveries in flight"
        in_flight |= held

    proc = subprocess.Popen(cmd, cwd=ROOT, env=env)
    try:
        _wait(
            lambda: all(_stats(app).get(q, (0,))[0] == N for q in ("group:mail", "group:books")),
            "every delivery to succeed after the restarts",
        )
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    stats = _stats(app)
    assert stats["group:mail"] == stats["group:books"] == (N, 0, 0, 0)

    lines = [line.split() for line in _lines(log)]
    handled = {(group, event) for _, group, event in lines}
    assert handled == {(g, e) for g in ("mail", "books") for e in events}
    starts = Counter(job for job, _, _ in lines)
    assert {j for j, n in starts.items() if n > 1} <= in_flight
    app.close()
