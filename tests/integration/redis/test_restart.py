"""A Redis restart mid-run: workers and producers reconnect and carry on.

A redis-server of the test's own (AOF, fsync at every write) serves a worker
process working through jobs while a producer keeps enqueueing.  The server
is stopped mid-run (SIGTERM: a clean shutdown; SIGKILL: a crash) and started
again on the same port and directory.  Every job enqueued before the
restart, and every job the producer enqueued while it was down (its enqueue
retries with backoff until the server is back), runs; the worker survives
and stops cleanly.
"""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from tests.integration.restart import restart_server_mid_run

from .conftest import RedisServer


@pytest.mark.parametrize("how", [signal.SIGTERM, signal.SIGKILL], ids=["sigterm", "sigkill"])
def test_worker_and_producer_carry_on_over_a_restart(
    redis_server: RedisServer, tmp_path: Path, how: signal.Signals
) -> None:
    url = redis_server.url(prefix="restart", reconnect="60")
    restart_server_mid_run(url, tmp_path, redis_server, how)
