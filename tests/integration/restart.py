"""The server-loss scenario every broker's restart test runs, written once.

A worker *process* (``tests.crash.crashapp``, which logs each job it starts)
works through a backlog while a producer thread keeps enqueuing; the test
takes the server away from both mid-run, either by ending the broker's
connections from the server side (``cut_connections_mid_run``: the shared
PostgreSQL and RabbitMQ must not be restarted) or by stopping and starting a
server of the test's own (``restart_server_mid_run``: Redis, NATS).  Then
every job whose enqueue returned must succeed: nothing acknowledged is lost,
the worker reconnects by itself, and no producer call fails.
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
from typing import Protocol

import dumbwaiter as dw
from dumbwaiter.brokers.types import JobFilter
from dumbwaiter.state import State
from tests.crash import crashapp
from tests.waiting import wait_until

ROOT = Path(__file__).resolve().parents[2]
#: jobs enqueued before the worker starts
BACKLOG = 1500


class Server(Protocol):
    """A server of the test's own that can be stopped and started again."""

    def stop(self, sig: signal.Signals = signal.SIGTERM) -> None: ...
    def start(self) -> None: ...


def started(log: Path) -> list[str]:
    """The ids of the jobs the worker process started, in order."""
    return [line.split()[0] for line in log.read_text().splitlines()] if log.exists() else []


def succeeded_ids(app: dw.App) -> set[str]:
    """Every succeeded job's id (the broker's own listing, page by page)."""

    async def go() -> set[str]:
        ids: set[str] = set()
        cursor = None
        try:
            while True:
                page = await app.broker.list_jobs(JobFilter(state=State.SUCCEEDED), cursor, 5000)
                ids |= {i.message.id for i in page.items}
                if page.cursor is None:
                    return ids
                cursor = page.cursor
        finally:
            await app.broker.close()  # this loop ends here: its connections too

    try:
        return asyncio.run(go())
    except dw.errors.BrokerError:  # the server is still starting
        return set()


class _Run:
    """The worker process, the producer thread and the jobs enqueued."""

    def __init__(self, url: str, tmp_path: Path, lease: int, mixed: bool) -> None:
        self.log = tmp_path / "started.log"
        env = {
            **os.environ,
            "DW_CRASH_URL": url,
            "DW_CRASH_LOG": str(self.log),
            "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)]),
        }
        # a producer that rides out the outage: it may wait longer than the
        # default producer deadline (5 s) for the server to come back
        self.app = dw.App(url, enqueue_timeout=60)
        self.work = self.app.task(name="crash.work")(crashapp.work.fn)
        self.before = {j.id for j in self.work.enqueue_many(range(BACKLOG))}
        self.during: list[str] = []
        self.failures: list[BaseException] = []
        self.producing = threading.Event()
        self._stop = threading.Event()
        self._mixed = mixed
        cmd = [
            sys.executable, "-m", "dumbwaiter", "worker", "--app", "tests.crash.crashapp:app",
            "-c", "16", "--lease", str(lease), "--heartbeat", "1", "--log-level", "error",
        ]  # fmt: skip
        self.worker = subprocess.Popen(cmd, cwd=ROOT, env=env)
        self._producer = threading.Thread(target=self._produce, daemon=True)

    def _produce(self) -> None:
        """One job at a time (and, ``mixed``, small batches in between), each
        call retrying inside the broker while the server is away."""
        i = BACKLOG
        while not self._stop.is_set():
            try:
                if self._mixed and i % 2 == 0:
                    self.during.extend(j.id for j in self.work.enqueue_many(range(i, i + 5)))
                else:
                    self.during.append(self.work.enqueue(i).id)
            except BaseException as exc:  # a producer call must not fail
                self.failures.append(exc)
                return
            self.producing.set()
            i += 1
            time.sleep(0.002)

    def start_producing(self) -> None:
        self._producer.start()
        assert self.producing.wait(30), "the producer could not enqueue"

    def until_started(self, n: int) -> None:
        wait_until(lambda: len(started(self.log)) >= n or self.worker.poll() is not None,
                   f"{n} jobs to start")  # fmt: skip
        assert self.worker.poll() is None, "the worker exited"

    def finish(self) -> None:
        """Producer carries on after the cut, then stops; every job succeeds."""
        count = len(self.during)
        wait_until(lambda: len(self.during) > count + 20 or bool(self.failures),
                   "the producer to enqueue again after the cut")  # fmt: skip
        self._stop.set()
        self._producer.join(timeout=60)
        assert not self.failures, f"a producer call failed: {self.failures[0]!r}"
        total = self.before | set(self.during)
        assert len(total) == len(self.before) + len(self.during)  # no id returned twice
        try:
            wait_until(lambda: total <= succeeded_ids(self.app), "every job to succeed", 120)
        except AssertionError as exc:
            raise AssertionError(f"{exc}: {self._stuck(total)}") from None
        assert self.worker.poll() is None, "the worker must survive (nobody restarted it)"
        assert total <= set(started(self.log))

    def _stuck(self, total: set[str]) -> str:
        """What the jobs that never succeeded look like: their states and
        whether the worker started them (a timeout's message)."""
        missing = sorted(total - succeeded_ids(self.app))
        ran = set(started(self.log))

        async def go() -> list[str]:
            try:
                out = []
                for i in missing[:10]:
                    info = await self.app.broker.get(i)
                    state = "no record" if info is None else info.state.value
                    out.append(f"{i} {state}{' started' if i in ran else ''}")
                return out
            finally:
                await self.app.broker.close()

        return f"{len(missing)} missing, e.g. {asyncio.run(go())}"

    def close(self) -> None:
        self._stop.set()
        if self._producer.is_alive():
            self._producer.join(timeout=60)
        self.worker.send_signal(signal.SIGTERM)
        code = self.worker.wait(timeout=60)
        self.app.close()
        assert code == 0, "a graceful stop exits cleanly"


def cut_connections_mid_run(url: str, tmp_path: Path, cut: Callable[[], int]) -> None:
    """End the broker's connections from the server side (``cut`` returns
    how many it ended) three times while the worker drains and the producer
    enqueues."""
    run = _Run(url, tmp_path, lease=5, mixed=True)
    try:
        run.start_producing()
        ended = 0
        for threshold in (300, 700, 1100):
            run.until_started(threshold)
            ended += cut()
        assert ended >= 3 * 2  # each time at least the worker's and the producer's
        run.finish()
    finally:
        run.close()


def restart_server_mid_run(url: str, tmp_path: Path, server: Server, how: signal.Signals) -> None:
    """Stop the server (``how``: SIGTERM a clean shutdown, SIGKILL a crash of
    the process) once a third of the backlog has started, and start it again
    on the same port and storage."""
    run = _Run(url, tmp_path, lease=10, mixed=False)
    try:
        run.until_started(BACKLOG // 3)
        run.start_producing()
        server.stop(how)
        time.sleep(0.5)  # the server stays down a while: nothing to wait on
        server.start()
        run.finish()
    finally:
        run.close()
