"""The overview's queue table tells running jobs from prefetched ones.

The broker counts every leased job; a worker's heartbeat says which of its
leased jobs wait in its buffer.  Here 2 of mail's 3 ready jobs are leased and
the worker record says 1 of them is buffered: 1 running, 1 prefetched.
"""

from __future__ import annotations

import re

import orjson
from starlette.testclient import TestClient

import dumbwaiter as dw
from dumbwaiter.dashboard import create_app
from tests.dashboard.conftest import LOOPBACK, Seeded, cell, in_thread
from tests.dashboard.dashapp import create_app as create_dashapp


def test_overview_shows_running_and_prefetched_apart(seeded: Seeded) -> None:
    async def lease() -> None:
        app: dw.App = create_dashapp()
        try:
            assert len(await app.broker.fetch(["mail"], 2, 60.0, 0, "w1")) == 2
            record = {"id": "w1", "queues": ["mail"], "prefetched": {"mail": 1}}
            await app.broker.kv_set({"worker:w1": orjson.dumps(record)}, ttl=60)
        finally:
            await app.aclose()

    in_thread(lease)
    star = create_app(create_dashapp(), sample=False)
    with TestClient(star, client=LOOPBACK) as c:
        page = c.get("/").text
    assert (cell(page, "mail", "running"), cell(page, "mail", "prefetched")) == ("1", "1")
    assert cell(page, "mail", "ready") == "1"
    assert re.search(r'class="label">prefetched</span><span class="value">1<', page)
