"""A NATS server restart mid-run: workers and producers reconnect and carry on.

A nats-server of the test's own (JetStream, file storage) serves a worker
process working through jobs while a producer keeps enqueueing one job at a
time.  The server is stopped mid-run (SIGTERM: a clean shutdown; SIGKILL: a
crash of the process, not of the machine: what it wrote is in the page
cache) and started again on the same port and storage directory.  Every job
enqueued before the restart, and every job whose enqueue returned around it
(an enqueue retries with backoff while the server is down), runs; the worker
survives and stops cleanly.
"""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from tests.integration.restart import restart_server_mid_run

from .conftest import NatsServer


@pytest.mark.parametrize("how", [signal.SIGTERM, signal.SIGKILL], ids=["sigterm", "sigkill"])
def test_worker_and_producer_carry_on_over_a_restart(
    nats_server: NatsServer, tmp_path: Path, how: signal.Signals
) -> None:
    url = nats_server.url(prefix="restart", reconnect="60")
    restart_server_mid_run(url, tmp_path, nats_server, how)
