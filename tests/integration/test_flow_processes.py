"""Cluster-wide limits across two real worker processes.

A rate limit of 50/s is never exceeded in any one-second window of the
jobs' start times, and a per-key concurrency of 3 is never exceeded, however
the two processes interleave.  (The achieved rate is a benchmark matter.)
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

import dumbwaiter as dw
from tests.apps import flowapp
from tests.brokers import BROKERS, CROSS_PROCESS, require_capability
from tests.waiting import wait_until

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("broker", CROSS_PROCESS)
def test_limits_hold_across_two_worker_processes(broker: str, tmp_path: Path) -> None:
    url = BROKERS[broker](tmp_path)
    log = tmp_path / "flow.log"
    app = dw.App(url, retry=dw.Retry.never())
    require_capability(broker, app.broker.capabilities, "limits")
    api_call = app.task(name="flow.api_call", rate_limit="50/s")(flowapp.api_call.fn)
    tenant_job = app.task(name="flow.tenant_job", concurrency=3, limit_key=lambda a: a["tenant"])(
        flowapp.tenant_job.fn
    )
    env = {
        **os.environ,
        "FLOWAPP_URL": url,
        "FLOWAPP_LOG": str(log),
        "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)]),
    }
    cmd = [sys.executable, "-m", "dumbwaiter", "worker", "--app", "tests.apps.flowapp:app",
           "-c", "16", "--log-level", "INFO"]  # fmt: skip
    # Both workers are up before any job exists: started after the enqueue,
    # one that came up late (a loaded machine) could find the other had run
    # every rate-limited job, and the limits would not be shared at all.
    outs = [tmp_path / f"worker{n}.err" for n in range(2)]
    workers = []
    for out in outs:
        with out.open("w") as f:
            workers.append(subprocess.Popen(cmd, cwd=ROOT, env=env, stderr=f))
    try:
        wait_until(
            lambda: all(" started: " in out.read_text() for out in outs), "both workers up", 60
        )
        try:
            api_call.enqueue_many(range(120))
            tenant_job.enqueue_many([(t, i) for t in ("a", "b") for i in range(15)])
        finally:  # the portal's connection (RabbitMQ's lives until its vhost is deleted)
            app.close()
        wait_until(
            lambda: len(log.read_text().splitlines() if log.exists() else []) >= 150,
            "every job to run",
            90,
        )
    finally:
        for w in workers:
            w.send_signal(signal.SIGTERM)
        for w in workers:
            assert w.wait(timeout=30) == 0
    lines = [line.split() for line in log.read_text().splitlines()]
    starts = sorted(float(p[1]) for p in lines if p[0] == "rate")
    assert len(starts) == 120 and len({p[2] for p in lines if p[0] == "rate"}) == 2
    for i, t in enumerate(starts):  # every window [t, t + 1) holds at most 50 starts
        assert sum(1 for u in starts[i : i + 60] if u < t + 1.0) <= 50
    spans = [(p[1], float(p[2]), float(p[3])) for p in lines if p[0] == "conc"]
    assert len(spans) == 30
    for tenant in ("a", "b"):
        mine = [(s, e) for k, s, e in spans if k == tenant]
        for s, _ in mine:  # at no start were more than 3 of the tenant's jobs running
            assert sum(1 for s2, e2 in mine if s2 <= s < e2) <= 3
