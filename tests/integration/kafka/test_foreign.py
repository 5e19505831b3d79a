"""A record on a queue topic that dumbwaiter did not write (no ``dw-id``
header): dead-lettered with its reason, then a dead letter like any other.

The same user-facing checks as ``tests/integration/test_foreign_bodies.py``
(listed, counted, shown with its raw bytes, replayed: it dies again for the
same reason, purged), except that a foreign producer cannot name the job's
id on Kafka: the broker derives one from where the record was read
(``brokers/kafka/foreign.py``), and the test finds it in ``dlq ls``.
"""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, TypeVar

import orjson
import pytest

import dumbwaiter as dw
from dumbwaiter.state import State
from dumbwaiter.testing import drain
from tests.brokers import BROKERS
from tests.integration.kafka.server import put_foreign
from tests.integration.test_foreign_bodies import BODIES, _dead_ids, _shown_body, _stats, cli

DECODE_ERROR = "dumbwaiter.errors.MessageDecodeError"
T = TypeVar("T")


def run(app: dw.App, coro: Coroutine[Any, Any, T]) -> T:
    """``asyncio.run``, closing the broker's clients of that loop at its end
    (as ``tests/integration/restart.py`` does)."""

    async def go() -> T:
        try:
            return await coro
        finally:
            await app.broker.close()

    return asyncio.run(go())


@pytest.mark.parametrize("name", ["garbage-bytes", "json-object", "text"])
def test_a_foreign_record_is_a_dead_letter_like_any_other(tmp_path: Path, name: str) -> None:
    url = BROKERS["kafka"](tmp_path)
    body = BODIES[name]
    app = dw.App(url, retry=dw.Retry.never())
    ran: list[int] = []

    @app.task
    def good(n: int) -> None:
        ran.append(n)

    try:
        run(app, app.broker.declare(["default"]))
        good.enqueue(1)
        run(app, put_foreign(app, "default", body))
        good.enqueue(2)
        run(app, drain(app))
        assert sorted(ran) == [1, 2]  # the others ran

        [jid] = _dead_ids(url)
        info = run(app, app.broker.get(jid))
        assert info is not None and info.state is State.DEAD and info.raw == body
        assert [e.type for e in info.message.errors] == [DECODE_ERROR]
        if name != "garbage-bytes":  # (not UTF-8: the words every broker gives it)
            assert "dw-id" in info.message.errors[0].message  # says why it is not a job
        counts = _stats(url)
        assert (counts["dead"], counts["ready"], counts["running"]) == (1, 0, 0)
        assert counts["succeeded"] == 2
        shown = cli(url, "dlq", "show", jid, "--json")
        assert shown.exit_code == 0, shown.output
        assert _shown_body(orjson.loads(shown.output)) == body

        replayed = cli(url, "dlq", "replay", jid)
        assert replayed.exit_code == 0 and "replayed 1 dead letter" in replayed.output
        run(app, drain(app))
        again = run(app, app.broker.get(jid))
        assert again is not None and again.state is State.DEAD and again.replays == 1
        assert again.raw == body
        assert [e.type for e in again.message.errors] == [DECODE_ERROR] * 2

        purged = cli(url, "dlq", "purge", jid, "--yes")
        assert purged.exit_code == 0, purged.output
        assert run(app, app.broker.get(jid)) is None
        assert _dead_ids(url) == []
        assert _stats(url)["dead"] == 0
    finally:
        app.close()
        # a connection left open would be collected here, failing this test,
        # not whichever test of this worker the collector next runs in (a
        # drain's stop once cut an admin client's start short: a socket left
        # open under load; test_cancelled_start)
        gc.collect()


async def test_a_foreign_record_read_twice_is_buried_once(tmp_path: Path) -> None:
    """A worker killed before its offset was committed, or a rebalance,
    hands the same record to a worker again: it is recognised by where it
    was read, and not buried a second time."""
    from aiokafka import TopicPartition

    from dumbwaiter.brokers import from_url
    from dumbwaiter.brokers.kafka import jobs
    from dumbwaiter.brokers.kafka.transport import Copy

    broker: Any = from_url(BROKERS["kafka"](tmp_path))
    try:
        await broker.declare(["default"])
        topic = broker.names.queue_topic("default")
        record = Copy(TopicPartition(topic, 0), 7, None, b"not a job", {}, 1_700_000_000.0)
        [(d, _)], _ = await jobs.judge(broker, [record], None, 30.0, "w", 10, {topic: "default"})
        assert (d.message, d.raw) == (None, b"not a job") and d.decode_error
        again, waiting = await jobs.judge(broker, [record], None, 30.0, "w", 10, {topic: "default"})
        assert (again, waiting) == ([], [])
        # another offset is another record
        other = Copy(TopicPartition(topic, 0), 8, None, b"not a job", {}, 1_700_000_000.0)
        [(d2, _)], _ = await jobs.judge(broker, [other], None, 30.0, "w", 10, {topic: "default"})
        assert d2.id != d.id
    finally:
        await broker.close()
