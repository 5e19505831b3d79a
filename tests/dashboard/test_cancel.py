"""Cancelling a running job from the dashboard, with the worker in another
process: the request goes through the broker's kv store, the worker's
heartbeat reads it, the handler sees ``ctx.cancelled`` and the job ends
``cancelled``."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from starlette.testclient import TestClient

from dumbwaiter.state import State
from tests.dashboard.conftest import Seeded, csrf
from tests.dashboard.dashapp import create_app as create_dashapp
from tests.waiting import wait_until

ROOT = Path(__file__).resolve().parents[2]


@contextlib.contextmanager
def worker_process(
    seeded: Seeded, started: Path, *queues: str
) -> Iterator[subprocess.Popen[bytes]]:
    env = {
        **os.environ,
        "DASHAPP_URL": seeded.url,
        "DASHAPP_STARTED": str(started),
        "PYTHONPATH": f"{ROOT / 'src'}{os.pathsep}{ROOT}",
    }
    cmd = [
        sys.executable, "-m", "dumbwaiter", "worker", "--app", "tests.dashboard.cancelapp:app",
        "-q", ",".join(queues), "--lease", "3", "--heartbeat", "0.2", "--log-level", "WARNING",
    ]  # fmt: skip
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)


def state_of(job_id: str) -> State | None:
    async def go() -> State | None:
        app = create_dashapp()
        try:
            info = await app.broker.get(job_id)
            return info.state if info else None
        finally:
            await app.aclose()

    return asyncio.run(go())


@pytest.mark.timeout(180)
def test_cancel_a_running_job_in_another_process(
    client: TestClient, seeded: Seeded, tmp_path: Path
) -> None:
    started = tmp_path / "started"
    app = create_dashapp()
    job = app.tasks["dashapp.crunch"].enqueue(10_000)
    other = app.tasks["dashapp.crunch"].enqueue(5)  # queued behind it (one slot)
    asyncio.run(app.aclose())
    with worker_process(seeded, started, "slow") as proc:
        wait_until(lambda: started.exists() and job.id in started.read_text(), "the job to start")
        page = client.get(f"/jobs/{job.id}").text
        assert 'id="job-state">running<' in page and "Cancel (ask it to stop)" in page
        r = client.post(
            "/actions/job/cancel",
            data={"csrf": csrf(page), "id": job.id, "next": f"/jobs/{job.id}"},
        )
        assert "asked 1 running job(s) to stop" in r.text
        if 'id="job-state">running<' in r.text:  # the page says a request is pending ...
            assert 'id="cancel-asked"' in r.text
        else:  # ... unless the worker stopped the job before the page was made
            assert 'id="job-state">cancelled<' in r.text
        wait_until(lambda: state_of(job.id) is State.CANCELLED, "the job to end cancelled")
        page = client.get(f"/jobs/{job.id}").text
        assert 'id="job-state">cancelled<' in page and "no failed attempt recorded" in page
        # the worker goes on with the next job, which runs to its end
        wait_until(lambda: state_of(other.id) is State.SUCCEEDED, "the next job to succeed")
        assert proc.poll() is None
        assert "<dt>took</dt>" in client.get(f"/jobs/{other.id}").text
    assert proc.returncode == 0
