"""The scaling signal, as an autoscaler reads it, from a real worker.

A worker process serves ``/metrics``; the test evaluates the query of the
KEDA ``ScaledObject`` in docs/deploying.md against that exposition (no
Kubernetes: the query is a ``max`` over one gauge, evaluated here), and
checks the value follows the load: 40 jobs held running or waiting on a
worker of concurrency 2 want 20 workers (no run time measured yet, each
job counts as a slot), and an empty queue wants none.  ``dumbwaiter stats``
says the same, and ``dumbwaiter health`` passes while the worker
heartbeats (and fails for a host with no worker).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

import orjson
import pytest
import yaml  # type: ignore[import-untyped]
from prometheus_client.parser import text_string_to_metric_families

import dumbwaiter as dw
from tests.apps import scaleapp
from tests.brokers import BROKERS
from tests.integration.serverproc import free_port
from tests.waiting import wait_until

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "deploying.md"

#: the PromQL this test can evaluate: an aggregation over one gauge's series
_QUERY = re.compile(r"^(max|sum)\((\w+)\{(.*)\}\)$")


def keda_trigger() -> dict[str, Any]:
    """The Prometheus trigger of the ``ScaledObject`` in docs/deploying.md."""
    for block in re.findall(r"```yaml\n(.*?)```", DOC.read_text(), re.S):
        doc = yaml.safe_load(block)
        if doc.get("kind") == "ScaledObject":
            [trigger] = [t for t in doc["spec"]["triggers"] if t["type"] == "prometheus"]
            return dict(trigger["metadata"])
    raise AssertionError("docs/deploying.md has no KEDA ScaledObject")


def evaluate(query: str, exposition: str, queue: str) -> float | None:
    """The value ``query`` (the docs' queue label swapped for ``queue``) has
    on ``exposition``; None when no series matches (Prometheus: no data)."""
    m = _QUERY.match(query.strip())
    assert m, f"the docs' query is not a max/sum over one gauge: {query!r}"
    agg, name, selector = m.groups()
    labels = dict(re.findall(r'(\w+)="([^"]*)"', selector))
    labels["queue"] = queue
    values = [
        s.value
        for fam in text_string_to_metric_families(exposition)
        for s in fam.samples
        if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())
    ]
    if not values:
        return None
    return max(values) if agg == "max" else sum(values)


def _scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        body: bytes = resp.read()
    return body.decode()


@pytest.mark.parametrize("broker", ["sqlite", "redis"])
def test_the_keda_query_follows_the_load(broker: str, tmp_path: Path) -> None:
    trigger = keda_trigger()
    assert trigger["threshold"] == "1"  # replicas = the metric's value
    query = trigger["query"]
    url = BROKERS[broker](tmp_path)
    gate = tmp_path / "gate"
    port = free_port()
    env = {
        **os.environ,
        "DUMBWAITER_URL": url,
        "SCALEAPP_GATE": str(gate),
        "DUMBWAITER_DRAIN_TARGET": "60",
        "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)]),
    }
    dumbwaiter = [sys.executable, "-m", "dumbwaiter"]

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*dumbwaiter, *args, "--url", url], cwd=ROOT, env=env, capture_output=True, text=True
        )

    err = tmp_path / "worker.err"
    cmd = [*dumbwaiter, "worker", "--app", "tests.apps.scaleapp:app", "-q", scaleapp.QUEUE,
           "-c", "2", "--metrics-port", str(port), "--grace", "5"]  # fmt: skip
    with err.open("w") as f:
        worker = subprocess.Popen(cmd, cwd=ROOT, env=env, stderr=f)
    try:
        wait_until(lambda: " started: " in err.read_text(), "the worker to start", 60)
        wait_until(lambda: cli("health").returncode == 0, "the worker's heartbeat", 60)
        gone = cli("health", "--host", "no-such-host", "--json")
        assert gone.returncode == 1 and orjson.loads(gone.stdout)["healthy"] is False

        app = dw.App(url)
        try:
            held = app.task(name=scaleapp.TASK, queue=scaleapp.QUEUE)(scaleapp.held)
            held.enqueue_many(range(40))
        finally:
            app.close()

        def keda() -> float | None:
            return evaluate(query, _scrape(port), scaleapp.QUEUE)

        # 2 running + 38 waiting, no run time measured yet: 40 slots / concurrency 2
        wait_until(lambda: keda() == 20, "the query to read 20 under load", 60)
        exposition = _scrape(port)
        per_worker = evaluate(
            'max(dumbwaiter_queue_backlog_per_worker{queue="x"})', exposition, scaleapp.QUEUE
        )
        assert per_worker == 40
        [row] = orjson.loads(cli("stats", "--json").stdout)["queues"]
        assert (row["workers"], row["desired_workers"]) == (1, 20)

        gate.touch()  # every job finishes: nothing waits, nothing runs
        wait_until(lambda: keda() == 0, "the query to read 0 once drained", 90)
        [row] = orjson.loads(cli("stats", "--json").stdout)["queues"]
        assert row["succeeded"] == 40 and row["desired_workers"] == 0
        assert row["job_seconds"] is not None  # measured now: the next load uses it
    finally:
        gate.touch()
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(timeout=30) == 0
