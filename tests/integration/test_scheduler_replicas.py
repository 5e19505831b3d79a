"""Scheduler replicas as real processes: a tick runs once however many run,
and a SIGKILLed leader is replaced without losing or repeating a tick.

Three ``dumbwaiter scheduler`` processes share one broker with a worker
process; ``tests.apps.schedapp`` has a schedule that fires every second, and
its task appends the tick's key to a file each time it runs.  The leader (the
replica that enqueued the latest tick) is killed with SIGKILL mid-run; another
replica takes over within one lease (5 s here) and enqueues the ticks that
fell meanwhile, late but once.
At the end, every tick from the first to the last that ran, ran exactly once.

Waiting is for conditions (lines in the file, jobs in the broker), never for
a fixed time.  The test runs on every broker in ``CROSS_PROCESS``.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path

import pytest

import dumbwaiter as dw
from dumbwaiter.brokers.types import JobFilter
from dumbwaiter.scheduler import LOCK
from tests.apps import schedapp
from tests.brokers import BROKERS, CROSS_PROCESS
from tests.waiting import wait_until

ROOT = Path(__file__).resolve().parents[2]
APP = "tests.apps.schedapp:app"
HEARTBEAT = "tests.apps.schedapp.heartbeat"
pytestmark = pytest.mark.crash


#: the replicas' lease: their lock lasts 4 s and is renewed every 1.67 s, so it
#: outlives a kill by at least 2.3 s and ticks fall while nobody can lead
LEASE = 5.0


class Runs:
    """The run log: one line per run of the heartbeat task: key, scheduler,
    job id, time the job was enqueued."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def rows(self) -> list[tuple[str, str, float]]:
        if not self.path.exists():
            return []
        out = []
        for line in self.path.read_text().splitlines():
            key, by, _job, created = line.split(" ")
            out.append((key, by, float(created)))
        return out

    def by(self) -> list[str]:
        return [by for _, by, _ in self.rows()]


def schedapp_env(url: str, runs: Runs) -> dict[str, str]:
    """The environment of a process running tests.apps.schedapp on ``url``,
    logging its runs to ``runs``: this checkout's code, and no app or URL
    of the caller's own environment."""
    env = {
        **os.environ,
        schedapp.URL_ENV: url,
        schedapp.LOG_ENV: str(runs.path),
        "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)]),
    }
    env.pop("DUMBWAITER_APP", None)
    env.pop("DUMBWAITER_URL", None)
    return env


def _pid(owner: str) -> int:
    """The pid inside a scheduler's owner id (``host:pid:random``)."""
    return int(owner.split(":")[-2])


def _tick(key: str) -> float:
    label = key.rsplit(":", 3)[-3:]  # periodic:NAME:2024-05-01T03:00:00Z
    return datetime.strptime(":".join(label), "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC).timestamp()


@contextmanager
def processes(env: dict[str, str]) -> Iterator[Callable[..., subprocess.Popen[bytes]]]:
    """Start ``dumbwaiter ARGS`` processes; any still running at the end is killed."""
    started: list[subprocess.Popen[bytes]] = []

    def start(*args: str) -> subprocess.Popen[bytes]:
        cmd = [sys.executable, "-m", "dumbwaiter", *args, "--app", APP, "--log-level", "WARNING"]
        p = subprocess.Popen(cmd, cwd=ROOT, env=env)
        started.append(p)
        return p

    try:
        yield start
    finally:
        for p in started:
            if p.poll() is None:
                p.kill()
                p.wait(timeout=10)


def _pending(app: dw.App) -> int:
    async def go() -> int:
        rows = await app.broker.stats()
        return sum(r.ready + r.scheduled + r.running + r.retrying for r in rows)

    return asyncio.run(go())


def _keys(app: dw.App) -> list[str]:
    async def go() -> list[str]:
        page = await app.broker.list_jobs(JobFilter(name=HEARTBEAT), limit=1000)
        return [i.message.key or "" for i in page.items]

    return asyncio.run(go())


@pytest.mark.parametrize("broker", CROSS_PROCESS)
def test_three_replicas_leader_killed_every_tick_runs_exactly_once(
    broker: str, tmp_path: Path
) -> None:
    url = BROKERS[broker](tmp_path)
    runs = Runs(tmp_path / "runs.log")
    env = schedapp_env(url, runs)
    app = dw.App(url)
    with processes(env) as start:
        worker = start("worker", "-q", "default", "-c", "8")
        replicas = [start("scheduler", "--lease", str(LEASE)) for _ in range(3)]
        by_pid = {p.pid: p for p in replicas}

        wait_until(lambda: len(runs.rows()) >= 3, "the first ticks to run")
        leader = by_pid[_pid(runs.by()[-1])]
        killed_at = time.time()
        leader.send_signal(signal.SIGKILL)
        assert leader.wait(timeout=10) == -signal.SIGKILL
        before = len(runs.rows())
        killed = runs.by()[-1]

        def others_ran(n: int) -> bool:
            return sum(1 for by in runs.by()[before:] if by != killed) >= n

        wait_until(lambda: others_ran(3), "another replica to lead and its ticks to run")
        for p in replicas:
            if p is not leader:
                p.send_signal(signal.SIGTERM)
        for p in replicas:
            if p is not leader:
                assert p.wait(timeout=30) == 0  # a clean stop exits 0 (and releases the lease)
        wait_until(lambda: _pending(app) == 0, "every enqueued tick to run")
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(timeout=30) == 0

    rows = runs.rows()
    counts = Counter(key for key, _, _ in rows)
    assert all(key.startswith(f"periodic:{HEARTBEAT}:") for key in counts)
    twice = {k: n for k, n in counts.items() if n > 1}
    assert not twice, f"ticks that ran more than once: {twice}"
    ticks = sorted(_tick(k) for k in counts)
    gaps = [(a, b) for a, b in itertools.pairwise(ticks) if b - a != 1]
    assert not gaps, f"ticks missing between {gaps}"  # every second of the window ran
    assert sorted(counts) == sorted(_keys(app))  # and nothing was enqueued that did not run
    leaders = [by for _, by, _ in rows]
    assert killed in leaders and len(set(leaders)) >= 2  # the run spans the failover
    assert _pid(leaders[-1]) != leader.pid
    # A tick after the kill can only come from another replica, and only once
    # the dead leader's lock ran out (at least ttl - renew = 2.3 s after the
    # kill): the successor caught up a tick that fell while nobody led.
    after = [(key, created) for key, by, created in rows if _tick(key) > killed_at]
    assert after and all(by != killed for key, by, _ in rows if _tick(key) > killed_at)
    first_key, first_created = min(after, key=lambda kc: _tick(kc[0]))
    assert first_created - _tick(first_key) >= 0.5, "the first tick after the kill ran late"

    async def lease_is_free() -> bool:
        token = await app.broker.acquire(LOCK, "after-the-test", 5)
        await app.broker.close()
        return token is not None

    assert asyncio.run(lease_is_free())  # the last leader stopped cleanly and released it


@pytest.mark.parametrize("broker", CROSS_PROCESS)
def test_worker_with_scheduler_runs_ticks_and_stops_cleanly(broker: str, tmp_path: Path) -> None:
    url = BROKERS[broker](tmp_path)
    runs = Runs(tmp_path / "runs.log")
    env = schedapp_env(url, runs)
    with processes(env) as start:
        w = start("worker", "-q", "default", "--with-scheduler")
        wait_until(lambda: len(runs.rows()) >= 2, "two ticks to run in the worker")
        w.send_signal(signal.SIGTERM)
        assert w.wait(timeout=30) == 0
    counts = Counter(key for key, _, _ in runs.rows())
    assert max(counts.values()) == 1 and {_pid(by) for by in runs.by()} == {w.pid}
