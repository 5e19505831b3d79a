"""Every broker the tests run against, in one place.

``BROKERS`` maps a name to a function that returns a URL naming a fresh,
empty namespace for one test (a private memory store, a new SQLite file, a
key prefix, a schema...).  Calling it again with the same ``tmp_path`` must
name the same namespace.  ``CROSS_PROCESS`` lists the brokers several
processes can share (the crash test runs on those).  A new broker joins the
conformance suite and the crash test by adding its line here; a broker whose
server is not reachable skips locally and fails in CI (``require_service``).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from pathlib import Path

from tests.integration.nats.server import nats_url
from tests.integration.postgres.server import postgres_url
from tests.integration.rabbitmq.server import rabbitmq_url
from tests.integration.redis.server import redis_url

_names = itertools.count()


def _memory_url(tmp_path: Path) -> str:
    return f"memory://conformance-{abs(hash(tmp_path))}-{next(_names)}"


def _sqlite_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path}/conformance.db"


BROKERS: dict[str, Callable[[Path], str]] = {
    "memory": _memory_url,
    "sqlite": _sqlite_url,
    "postgres": postgres_url,
    "redis": redis_url,
    "rabbitmq": rabbitmq_url,
    "nats": nats_url,
}

CROSS_PROCESS: list[str] = ["sqlite", "postgres", "redis", "rabbitmq", "nats"]
