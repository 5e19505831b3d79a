"""Consumer lag per partition: ``dumbwaiter stats`` (table and ``--json``)
and the dashboard's queue page show each partition of a Kafka queue's
topic, its end offset, the workers' committed offset and the lag."""

from __future__ import annotations

import gc
import re
from pathlib import Path
from typing import Any

import orjson
from click.testing import CliRunner
from starlette.testclient import TestClient

import dumbwaiter as dw
from dumbwaiter.cli import main
from dumbwaiter.dashboard import create_app
from dumbwaiter.testing import drain
from tests.brokers import BROKERS
from tests.dashboard.conftest import LOOPBACK, in_thread

JOBS = 5


def _partitions(url: str) -> list[dict[str, Any]]:
    out = CliRunner().invoke(main, ["stats", "--json", "--url", url], catch_exceptions=False)
    assert out.exit_code == 0, out.output
    rows: list[dict[str, Any]] = orjson.loads(out.output)["partitions"]
    return [r for r in rows if r["queue"] == "default"]


def test_stats_and_the_queue_page_show_lag_per_partition(tmp_path: Path) -> None:
    url = BROKERS["kafka"](tmp_path)
    app = dw.App(url)

    @app.task
    def job(i: int) -> None:
        pass

    try:
        for i in range(JOBS):  # one at a time: one record per produce
            job.enqueue(i)
        waiting = _partitions(url)
        assert sorted(r["partition"] for r in waiting) == [0, 1, 2]  # partitions=3
        assert sum(r["lag"] for r in waiting) == JOBS
        assert all(r["lag"] == r["end"] - r["committed"] for r in waiting)

        table = CliRunner().invoke(main, ["stats", "--url", url], catch_exceptions=False)
        assert table.exit_code == 0 and "committed" in table.output

        star = create_app(dw.App(url), sample=False)
        with TestClient(star, client=LOOPBACK) as c:
            page = c.get("/queues/default").text
        assert 'id="partitions"' in page
        lags = [int(x) for x in re.findall(r'data-col="lag">(\d+)<', page)]
        assert sum(lags) == JOBS

        in_thread(lambda: drain(app))
        done = _partitions(url)
        assert sum(r["lag"] for r in done) == 0
        assert sum(r["committed"] for r in done) == JOBS
    finally:
        app.close()
        gc.collect()  # a connection left open fails this test, not the worker's next one
