"""The overview page says where the app's processes may run: the broker's
``multi_host`` (issue 20: nothing said a RabbitMQ app on its default state
store was one machine's)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from starlette.testclient import TestClient

from dumbwaiter.dashboard import create_app
from tests.brokers import BROKERS
from tests.dashboard.conftest import LOOPBACK


@pytest.mark.parametrize(
    ("name", "scope"),
    [("sqlite", "single-host"), ("redis", "multi-host"), ("rabbitmq", "single-host")],
)
def test_the_overview_says_whether_the_deployment_is_multi_host(
    name: str, scope: str, tmp_path: Path
) -> None:
    url = BROKERS[name](tmp_path)
    with TestClient(create_app(url, sample=False), client=LOOPBACK) as c:
        page = c.get("/").text
    m = re.search(r'<p class="muted" id="scope">deployment: ([^<]*)</p>', page)
    assert m, page
    assert m.group(1).startswith(scope)
    if name == "rabbitmq":  # it names the store that keeps it on one machine
        assert "rabbitmq-state.db" in m.group(1)
