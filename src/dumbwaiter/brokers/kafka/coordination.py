"""Which state store a Kafka app uses: the rules, and the cluster's word.

Kafka has no key-value store, no locks and no index of jobs, so a *state
store* (another dumbwaiter broker, ``state=``) keeps the job records, unique
keys, limits, the scheduler's lease, results and the admin's view.  Every
process of the app, on every host, must use the same one, or the truth
splits without an error (issue 20.1).  Two rules keep it whole:

* the store must be one every host can share (Redis, PostgreSQL, NATS): a
  SQLite file or a memory store is one machine's (one process's), refused
  unless the URL says ``single_host=true`` (every process on one machine);
* the cluster arbitrates: each process writes its store's identity
  (``identity.py``) to the app's one-partition ``P.state`` topic (kept
  forever) and reads the record at the lowest offset: the first process
  ever to write wins, and a process whose store is not that one refuses to
  start with ``StateStoreConflict``, naming both.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any
from urllib.parse import urlsplit

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.errors import UnknownTopicOrPartitionError

from ...errors import BrokerError, ConfigurationError, InvalidURL, StateStoreConflict
from ...redact import mask_url
from .. import from_url
from ..base import Broker
from ..identity import Identity
from .connection import Link, started, stopped

#: state stores only one machine can share
SINGLE_HOST_SCHEMES = ("sqlite", "memory")
#: seconds a process waits to read the announcement back
READ_WAIT = 15.0


def state_store(state_url: str | None, kafka_url: str, single_host: bool) -> Broker:
    """The state store ``state=`` names, checked against the rules above."""
    where = f"kafka URL {mask_url(kafka_url)!r}"
    if not state_url:
        raise InvalidURL(
            f"{where} names no state store: Kafka keeps no job records, locks or "
            "key-value data, so add state=URL (URL-encoded): a Redis, PostgreSQL or NATS "
            "store that every process on every host reaches"
        )
    scheme = urlsplit(state_url).scheme.lower()
    if scheme == "kafka":
        raise InvalidURL(f"{where}: the state store cannot be Kafka itself")
    if scheme in SINGLE_HOST_SCHEMES and not single_host:
        raise InvalidURL(
            f"{where}: state={mask_url(state_url)!r} is a {scheme} store, which only one "
            "machine can share, while a Kafka app's processes usually run on several: two "
            "hosts would each keep half the job records, locks and unique keys and nothing "
            "would fail. Use a Redis, PostgreSQL or NATS store, or add single_host=true if "
            "every process of this app runs on this one machine"
        )
    try:
        return from_url(state_url)
    except InvalidURL as exc:
        raise InvalidURL(f"the state= of {where}: {exc}") from None


async def claim(link: Link, topic: str, replication: int, ours: Identity, where: str) -> None:
    """Announce ``ours`` on ``topic`` (or agree with the first announcement);
    raise ``StateStoreConflict`` when the first is another store."""
    # clients of its own, closed here: a process that only reads the admin's
    # view (``asyncio.run`` per call) must not leave clients on a closed loop
    once = Link(link.config, link.loop)
    try:
        await once.create_topics(
            [(topic, 1, replication, {"retention.ms": "-1", "cleanup.policy": "delete"})]
        )
        producer = await once.producer(1024 * 1024)
        await producer.send_and_wait(topic, ours.dump(), key=ours.key.encode(), partition=0)
    finally:
        await once.close()
    first = await _first(link.config, topic)
    if first is None:
        raise BrokerError(f"kafka: {where}: the state-store announcement could not be read")
    if first.key != ours.key:
        raise _conflict(ours, first, where)


async def _first(config: dict[str, Any], topic: str) -> Identity | None:
    """The identity at the lowest offset of ``topic`` (None: not readable)."""
    consumer = AIOKafkaConsumer(**config, enable_auto_commit=False, fetch_max_wait_ms=100)
    try:
        await started(consumer)  # (one cancelled midway leaves nothing open)
        tp = TopicPartition(topic, 0)
        consumer.assign([tp])
        await consumer.seek_to_beginning(tp)
        stop = time.monotonic() + READ_WAIT
        while time.monotonic() < stop:
            got = await consumer.getmany(tp, timeout_ms=200, max_records=1)
            for rec in got.get(tp, []):
                return Identity.load(rec.value or b"")
        return None
    finally:
        await stopped(consumer)


async def forget(link: Link, topic: str) -> bool:
    """Delete the announcement (every process of the app must be stopped)."""
    admin = await link.admin()
    try:
        await admin.delete_topics([topic])
    except UnknownTopicOrPartitionError:
        return False
    await asyncio.sleep(0)
    return True


def _conflict(ours: Identity, theirs: Identity, where: str) -> StateStoreConflict:
    return StateStoreConflict(
        f"{where} keeps its job state in {theirs.describe()}, but this process would keep "
        f"it in {ours.describe()}. Two state stores for one Kafka app split the jobs' "
        "records, locks, limits and unique keys between them, so this process refuses to "
        "start. Fix: give every process of the app the same state=, or this one a prefix= "
        "of its own; to move the app to another state store on purpose, stop every process "
        "of it and run `dumbwaiter state reset-identity` (docs/kafka.md).",
        ours=ours.describe(),
        theirs=theirs.describe(),
    )


__all__ = ["ConfigurationError", "claim", "forget", "state_store"]
