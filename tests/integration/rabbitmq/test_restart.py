"""Surviving the server: every connection of the test is closed mid-run.

The shared RabbitMQ must not be restarted (others use it), and its management
API may be off, so the test does to the broker what a restart does to its
clients: ``rabbitmqctl close_connection`` ends every AMQP connection whose
name carries this test's prefix (the worker process's, the producer's), from
the server side, three times while a worker drains and a producer keeps
enqueuing.  Then every job whose enqueue returned must succeed: nothing
confirmed is lost, the worker reconnects by itself, and no producer call
fails.

What it does not show: a real restart also loses unconfirmed publishes in
flight and takes the queues away for a while (a quorum queue's leader is
re-elected, a classic priority lane is read back from disk).  The producer's
retry window (``reconnect=``, 30 s) and the worker's back-off cover that
time; the durability of confirmed messages across a restart is RabbitMQ's
own (quorum queues fsync before they confirm), which this test cannot
exercise without restarting the server.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from tests.conftest import require_service
from tests.integration.rabbitmq import server
from tests.integration.restart import cut_connections_mid_run

CTL = shutil.which("rabbitmqctl") or "/usr/sbin/rabbitmqctl"


def _close_connections(prefix: str) -> int:
    """Close every connection named for ``prefix`` (never anyone else's)."""
    out = subprocess.run(
        [CTL, "-q", "list_connections", "pid", "client_properties"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    mine = [line.split()[0] for line in out.splitlines() if f"dumbwaiter {prefix} " in line]
    for pid in mine:
        subprocess.run(
            [CTL, "-q", "close_connection", pid, "dumbwaiter restart test"],
            capture_output=True,
            timeout=60,
            check=False,
        )
    return len(mine)


def test_workers_and_producers_reconnect_after_their_connections_close(tmp_path: Path) -> None:
    if not os.path.exists(CTL):
        require_service("rabbitmqctl", False, f"{CTL} is needed to close the test's connections")
    prefix = server.new_prefix()
    url = server.url(prefix, f"sqlite:///{tmp_path}/state.db")
    cut_connections_mid_run(url, tmp_path, lambda: _close_connections(prefix))
