"""Crash safety: a worker killed with SIGKILL loses nothing.

A worker process works through 2,000 jobs; it is killed with SIGKILL twice
and restarted.  Each kill lands mid-job: the test makes the jobs that start
hold still (``crashapp``'s hold file) and kills once several say they hold.
At the end every job has succeeded, each job held at a kill began under the
killed worker and finished under another (it was re-run: a kill that fell
between jobs would fail here), and the only jobs that ran twice are the ones
the killed worker held (leased, not yet acked) at the moment of a kill.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import dumbwaiter as dw
from dumbwaiter.brokers.types import JobFilter
from dumbwaiter.state import State
from tests.brokers import BROKERS, CROSS_PROCESS
from tests.crash import crashapp, diagnose
from tests.waiting import wait_until

ROOT = Path(__file__).resolve().parents[2]
N = 2000
#: jobs that must hold (mid-run) in the worker before it is killed
HELD_AT_KILL = 8
# room for a wait below to time out and the test to say why (``diagnose``)
# before pytest-timeout stops it
pytestmark = [pytest.mark.crash, pytest.mark.timeout(420)]


def _wait(cond: Callable[[], bool], what: str, timeout: float = 120.0) -> None:
    # generous: a killed worker's jobs come back after the broker's own lease
    # (NATS' AckWait is 30 s), on a CI machine whose two cores may be busy
    wait_until(cond, what, timeout)


@contextlib.contextmanager
def _killed_on_failure(proc: subprocess.Popen[bytes]) -> Iterator[None]:
    """A failing wait must not leave the worker process running."""
    try:
        yield
    except BaseException:
        proc.kill()
        proc.wait(timeout=10)
        raise


def _stop(proc: subprocess.Popen[bytes]) -> None:
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 0  # graceful stop exits cleanly


def _explained(app: dw.App, log: Path, exc: AssertionError) -> AssertionError:
    """``exc`` (a wait that timed out) with what the unfinished jobs look
    like once the worker is stopped (``diagnose``): a job that never
    finishes is a lost job, and this is all that is left to explain it."""
    return AssertionError(f"{exc}\n{asyncio.run(diagnose.unfinished(app, _lines(log)))}")


def _lines(log: Path) -> list[str]:
    return log.read_text().splitlines() if log.exists() else []


def _pairs(log: Path) -> set[tuple[str, int]]:
    """(job id, pid) of each line of a ``crashapp`` log."""
    return {(f[0], int(f[1])) for f in (line.split() for line in _lines(log))}


def _env(url: str, tmp_path: Path) -> dict[str, str]:
    return {
        **os.environ,
        "DW_CRASH_URL": url,
        "DW_CRASH_LOG": str(tmp_path / "started.log"),
        "DW_CRASH_HELD": str(tmp_path / "held.log"),
        "DW_CRASH_DONE": str(tmp_path / "done.log"),
        "DW_CRASH_HOLD": str(tmp_path / "hold"),
        "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)]),  # this checkout's code
    }


def _kill_mid_job(proc: subprocess.Popen[bytes], tmp_path: Path) -> set[tuple[str, int]]:
    """SIGKILL ``proc`` while ``HELD_AT_KILL`` of its jobs are mid-run (they
    hold while the hold file exists); return those jobs, with its pid."""
    hold, held = tmp_path / "hold", tmp_path / "held.log"

    def holding() -> set[tuple[str, int]]:
        return {p for p in _pairs(held) if p[1] == proc.pid}

    hold.touch()
    try:
        with _killed_on_failure(proc):
            _wait(lambda: len(holding()) >= HELD_AT_KILL, f"{HELD_AT_KILL} jobs to hold mid-run")
        proc.send_signal(signal.SIGKILL)
        assert proc.wait(timeout=10) == -signal.SIGKILL
    finally:
        hold.unlink()
    return holding()


def _assert_rerun(held: set[tuple[str, int]], tmp_path: Path) -> None:
    """Each job held at a kill began under the killed worker and finished
    under another one only: it was run again after the kill."""
    assert len(held) >= HELD_AT_KILL
    started, done = _pairs(tmp_path / "started.log"), _pairs(tmp_path / "done.log")
    for job, killed in held:
        assert (job, killed) in started
        finished_by = {pid for j, pid in done if j == job}
        assert finished_by, f"job {job}, held by the killed worker {killed}, never finished"
        assert killed not in finished_by, (job, killed, finished_by)


def _running_ids(app: dw.App) -> set[str]:
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
def test_sigkill_twice_every_job_succeeds_once_or_was_in_flight(
    broker: str, tmp_path: Path
) -> None:
    url = BROKERS[broker](tmp_path)
    log = tmp_path / "started.log"
    env = _env(url, tmp_path)
    app = dw.App(url)
    work = app.task(name="crash.work")(crashapp.work.fn)  # the task the workers know
    ids = {j.id for j in work.enqueue_many(range(N))}
    assert len(ids) == N

    cmd = [
        sys.executable, "-m", "dumbwaiter", "worker", "--app", "tests.crash.crashapp:app",
        "-c", "16", "--lease", "2", "--heartbeat", "0.5", "--log-level", "WARNING",
    ]  # fmt: skip

    def start() -> subprocess.Popen[bytes]:
        return subprocess.Popen(cmd, cwd=ROOT, env=env)

    in_flight_at_kills: set[str] = set()
    held_at_kills: set[tuple[str, int]] = set()
    for threshold in (N // 4, N // 2):
        proc = start()
        with _killed_on_failure(proc):
            _wait(lambda t=threshold: len(_lines(log)) >= t, f"{threshold} jobs to start")  # type: ignore[misc]
        held_at_kills |= _kill_mid_job(proc, tmp_path)
        held = _running_ids(app)
        assert held, "the kill should find jobs in flight"
        in_flight_at_kills |= held

    proc = start()
    with _killed_on_failure(proc):
        try:
            _wait(
                lambda: asyncio.run(app.broker.stats())[0].succeeded == N,
                "every job to succeed after the restarts",
            )
        except AssertionError as exc:  # stopped first: its copies go back to the queues
            _stop(proc)
            raise _explained(app, log, exc) from None
    _stop(proc)
    [stats] = asyncio.run(app.broker.stats())
    assert (stats.succeeded, stats.dead, stats.ready, stats.running) == (N, 0, 0, 0)

    starts = Counter(line.split()[0] for line in _lines(log))
    assert set(starts) == ids  # every job ran
    ran_twice = {i for i, n in starts.items() if n > 1}
    assert ran_twice <= in_flight_at_kills  # only jobs held at a kill ran again
    _assert_rerun(held_at_kills, tmp_path)  # and the jobs mid-run at a kill did
    asyncio.run(app.broker.close())


@pytest.mark.parametrize("broker", CROSS_PROCESS)
def test_batch_survives_sigkill_each_shard_succeeds_once_or_was_in_flight(
    broker: str, tmp_path: Path
) -> None:
    url = BROKERS[broker](tmp_path)
    log = tmp_path / "started.log"
    env = _env(url, tmp_path)
    app = dw.App(url)
    shard = app.task(name="crash.shard")(crashapp.shard.fn)
    batch = app.batch(shard, list(range(3000)), chunk_size=5)  # 600 shards of 5 items
    assert batch.progress()["total"] == 600
    cmd = [
        sys.executable, "-m", "dumbwaiter", "worker", "--app", "tests.crash.crashapp:app",
        "-c", "16", "--lease", "2", "--heartbeat", "0.5", "--log-level", "WARNING",
    ]  # fmt: skip
    in_flight: set[str] = set()
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env)
    with _killed_on_failure(proc):
        _wait(lambda: len(_lines(log)) >= 200, "200 shards to start")
    held_at_kill = _kill_mid_job(proc, tmp_path)
    in_flight |= _running_ids(app)
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env)
    with _killed_on_failure(proc):
        try:
            _wait(lambda: batch.progress()["state"] == "complete", "the batch to complete")
        except AssertionError as exc:  # stopped first: its copies go back to the queues
            _stop(proc)
            raise _explained(app, log, exc) from None
    _stop(proc)
    p = batch.progress()
    assert (p["done"], p["failed"], p["total"]) == (600, 0, 600)
    starts = Counter(line.split()[0] for line in _lines(log))
    assert len(starts) == 600
    assert {i for i, n in starts.items() if n > 1} <= in_flight
    _assert_rerun(held_at_kill, tmp_path)  # the shards mid-run at the kill ran again
    app.close()
