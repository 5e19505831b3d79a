"""Every broker the tests run against, in one place.

``BROKERS`` maps a name to a function that returns a URL naming a fresh,
empty namespace for one test (a private memory store, a new SQLite file, a
key prefix, a schema...).  Calling it again with the same ``tmp_path`` must
name the same namespace.  ``CROSS_PROCESS`` lists the brokers several
processes can share (the crash test runs on those).  A new broker joins the
conformance suite and the crash test by adding its line here; a broker whose
server is not reachable skips locally and fails in CI (``require_service``).

RabbitMQ keeps its job records, kv, locks, rate limits and slots in a state
store of another engine (``state=URL``): ``rabbitmq`` uses a SQLite file,
``rabbitmq+redis`` and ``rabbitmq+postgres`` (``STATE_STORES``) a Redis
prefix and a PostgreSQL schema of the test's own, so the conformance suite
(``CONFORMANCE``) runs that part on every state store a deployment would use.

Kafka (``kafka``) needs a state store every host shares: its rows use a
Redis prefix of the test's own, on the ``tansu`` server the test process
starts (``tests/integration/kafka/server.py``; ``DW_TEST_KAFKA`` names a
real cluster instead).

``CAPABILITIES`` says which capabilities each broker must report.  A test
that needs one asks ``require_capability``: where the broker lacks it, the
test is skipped locally, and in CI it fails if the broker is listed with it
(a broker that dropped a flag must not lose whole files of tests silently).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from pathlib import Path

import pytest

from dumbwaiter.brokers.types import Capabilities
from tests.conftest import IN_CI
from tests.integration.kafka.server import kafka_url
from tests.integration.nats.server import nats_url
from tests.integration.postgres.server import postgres_url
from tests.integration.rabbitmq.server import rabbitmq_url
from tests.integration.redis.server import redis_url

_names = itertools.count()


def _memory_url(tmp_path: Path) -> str:
    return f"memory://conformance-{abs(hash(tmp_path))}-{next(_names)}"


def _sqlite_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path}/conformance.db"


def _redis_queues_url(tmp_path: Path) -> str:
    """Redis with a hash tag per queue (``layout=queues``: what a cluster spreads)."""
    return f"{redis_url(tmp_path)}&layout=queues"


def _rabbitmq_on_redis(tmp_path: Path) -> str:
    return rabbitmq_url(tmp_path, state=redis_url(tmp_path))


def _rabbitmq_on_postgres(tmp_path: Path) -> str:
    return rabbitmq_url(tmp_path, state=postgres_url(tmp_path))


#: RabbitMQ on the other state stores (its kv, locks, limits and records
#: live there): every test that takes ``BROKERS`` runs them too.
STATE_STORES: dict[str, Callable[[Path], str]] = {
    "rabbitmq+redis": _rabbitmq_on_redis,
    "rabbitmq+postgres": _rabbitmq_on_postgres,
}

BROKERS: dict[str, Callable[[Path], str]] = {
    "memory": _memory_url,
    "sqlite": _sqlite_url,
    "postgres": postgres_url,
    "redis": redis_url,
    "redis-queues": _redis_queues_url,
    "rabbitmq": rabbitmq_url,
    "nats": nats_url,
    "kafka": kafka_url,
    **STATE_STORES,
}

CROSS_PROCESS: list[str] = [
    "sqlite",
    "postgres",
    "redis",
    "redis-queues",
    "rabbitmq",
    "nats",
    "kafka",
]

_EVERY_ENGINE = frozenset(
    {"native_delay", "priorities", "blocking_fetch", "results", "events", "limits"}
)
_SHARED = _EVERY_ENGINE | {"multi_process"}
#: every process on every host shares one truth (RabbitMQ: on a server state store)
_HOSTS = _SHARED | {"multi_host"}

#: The ``Capabilities`` flags each broker must report True.  A flag missing
#: here may still be reported (a broker can gain one before this list does),
#: except ``multi_host``: a broker claiming it where it is not listed would
#: let a deployment rely on a truth it does not share (``memory``, ``sqlite``
#: and ``rabbitmq`` on its SQLite state store are one machine's); see
#: ``test_the_broker_reports_the_capabilities_it_must``.  ``ordered_keys`` is
#: in no list: no broker promises order per key yet.
CAPABILITIES: dict[str, frozenset[str]] = {
    # native_capacity: a bounded queue's count is in the engine's own enqueue
    # step (the others take the seam's lock per queue: brokers/capacity.py)
    "memory": _EVERY_ENGINE | {"sync_enqueue", "native_capacity"},
    "sqlite": _SHARED | {"sync_enqueue", "transactional_outbox", "native_capacity"},
    "postgres": _HOSTS | {"sync_enqueue", "transactional_outbox", "native_capacity"},
    "redis": _HOSTS | {"sync_enqueue", "native_capacity"},
    "redis-queues": _HOSTS | {"sync_enqueue", "native_capacity"},
    "rabbitmq": _SHARED,
    "rabbitmq+redis": _HOSTS,
    "rabbitmq+postgres": _HOSTS,
    "nats": _HOSTS,
    # no priorities: Kafka hands a partition out in order (a worker orders
    # only what it has read); ordered keys: a key's events are in one
    # partition, and a group runs them one at a time (a key lock in the
    # state store); the rest on its Redis state store
    "kafka": (_HOSTS - {"priorities"}) | {"ordered_keys"},
}


def require_capability(name: str, capabilities: Capabilities, flag: str) -> None:
    """Skip the test when broker ``name`` does not report ``flag``; in CI,
    fail instead if ``CAPABILITIES`` says it must report it."""
    if getattr(capabilities, flag):
        return
    if IN_CI and flag in CAPABILITIES[name]:
        pytest.fail(
            f"broker {name!r} does not report capabilities.{flag}: CAPABILITIES says it must"
        )
    pytest.skip(f"broker {name!r} does not report capabilities.{flag}")
