"""benchmarks/web_endpoint.py runs end to end and reports what docs/benchmarks.md quotes.

Tiny numbers on Redis (the save on PostgreSQL): the server, the worker and
the load client all start, every route answers, the JSON has each figure the
docs read, and the run leaves no keys or tables behind.  No timing is
asserted: the figures of a run this small mean nothing.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import require_service
from tests.integration.postgres import server as pg
from tests.integration.redis import server as rd

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "web_endpoint.py"
FIGURE = {"median", "min", "max"}


def _run(*args: str, timeout: float = 240.0) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)])}
    cmd = [sys.executable, str(SCRIPT), *args]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)


@pytest.fixture
def services() -> None:
    for name, check in (("Redis", rd._check), ("PostgreSQL", pg._check)):
        require_service(name, *check())


@pytest.mark.usefixtures("services")
def test_a_tiny_run_reports_every_route_and_cleans_up() -> None:
    out = _run(
        "--brokers", rd.SERVER, "--save-dsn", pg.SERVER, "--rounds", "2",
        "--requests", "6", "--warmup", "2", "--concurrency", "2", "--profile", "3", "--json",
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads(out.stdout)
    assert report["args"]["worker"] is True
    assert {"python", "cpus", "loadavg", "loadavg_after"} <= set(report["machine"])
    entry: dict[str, Any] = report["brokers"]["redis"]
    assert len(entry["rounds"]) == 2
    for rnd in entry["rounds"]:
        assert list(rnd) == ["save", "dw", "bare"]  # alternated in this order
        assert all(r["n"] == 6 and r["rps"] > 0 for r in rnd.values())
    s = entry["summary"]
    for route, calls in (("save", 0), ("dw", 3), ("bare", 3)):
        for key in ("p50_ms", "p90_ms", "p99_ms", "rps"):
            assert set(s[route][key]) == FIGURE, (route, key)
            assert s[route][key]["min"] <= s[route][key]["median"] <= s[route][key]["max"]
        assert len(s[route]["endpoint_us"]) == 1 + calls  # the save, then each call
        assert ("added_p50_ms" in s[route]) == (route != "save")
    assert "dw_over_bare_added_p50" in s
    assert set(entry["profiles"]) == {"dw", "bare"}
    for text in entry["profiles"].values():
        assert "share of the profiled time, by package" in text and "function calls" in text
    shares = entry["profiles"]["dw"].split("\n\n")[0]
    assert "dumbwaiter" in shares and "redis" in shares  # the dw route goes through both

    # the worker ran every job the dw route enqueued and every event's
    # subscriber job: warm-up, two rounds and the profile's requests
    after = {r["queue"]: r for r in entry["queues_after"]}
    assert set(after) == {"bench_web_email", "bench_web_hooks", "group:bench_web_analytics"}
    for q in after.values():
        assert (q["succeeded"], q["ready"], q["dead"]) == (2 + 2 * 6 + 3, 0, 0), q

    import psycopg
    import redis

    tag = entry["namespace"]
    client = redis.Redis.from_url(rd.SERVER)
    try:
        left = [k for p in (f"{{dw:{tag}}}:*", f"{tag}:*") for k in client.scan_iter(match=p)]
    finally:
        client.close()
    assert left == []
    with psycopg.connect(pg.SERVER) as conn:
        row = conn.execute("SELECT to_regclass(%s)", (f"{tag}_orders",)).fetchone()
    assert row == (None,)


def test_an_unknown_broker_is_named_before_anything_starts() -> None:
    out = _run("--brokers", "mysql://127.0.0.1/x", timeout=60)
    assert out.returncode != 0
    assert "'mysql://127.0.0.1/x' is not redis, postgres, nats" in out.stderr
