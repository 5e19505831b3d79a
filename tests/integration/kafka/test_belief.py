"""A job's first copy says what its record holds (``kafka/belief.py``): the
worker leases on that in one state-store round trip, and reads the record
first only when the belief is wrong.  A belief that no longer matches what
the enqueue writes would cost every pickup an extra round trip, silently;
these tests catch that drift, and that a wrong belief still judges right."""

from __future__ import annotations

import time

import dumbwaiter as dw
from dumbwaiter.brokers import from_url
from dumbwaiter.brokers.kafka import KafkaBroker
from dumbwaiter.brokers.kafka.belief import record_of
from dumbwaiter.brokers.kafka.names import tier_for
from tests.conformance.conftest import msg
from tests.integration.kafka.copies import first_copies
from tests.integration.kafka.server import new_prefix, url
from tests.integration.redis.server import new_prefix as redis_prefix
from tests.integration.redis.server import url as redis_url


async def test_a_first_copy_rebuilds_the_record_its_enqueue_wrote() -> None:
    b = from_url(url(new_prefix(), redis_url(redis_prefix())))
    assert isinstance(b, KafkaBroker)
    try:
        now, later = msg(args=[1, {"x": "é"}], key="k1", priority=3), msg(eta=time.time() + 60)
        await b.enqueue([now])
        await b.enqueue([later])
        records = await b.state.kv_get([b.names.job + m.id for m in (now, later)])
        [ready] = await first_copies(b, b.names.queue_topic("default"), 1)
        tier = b.names.tier_topic(tier_for(59.0))  # due in a little under 60 s
        [delayed] = await first_copies(b, tier, 1)
        for copy, m in ((ready, now), (delayed, later)):
            rec = record_of(copy)
            assert rec is not None
            assert rec.dump() == records[b.names.job + m.id]
    finally:
        await b.close()


async def test_a_copy_whose_job_changed_since_is_judged_by_its_record() -> None:
    """The first copy of a job cancelled since, and a first copy written
    twice (a producer that tried again) read after the first was leased,
    believe a waiting record: the judge reads the real one, and runs neither."""
    b = from_url(url(new_prefix(), redis_url(redis_prefix()), partitions="1"))
    assert isinstance(b, KafkaBroker)
    try:
        cancelled, twice = msg(), msg()
        await b.enqueue([cancelled])
        assert await b.cancel([cancelled.id]) == [cancelled.id]
        await b.enqueue([twice])
        topic = b.names.queue_topic("default")
        copy = (await first_copies(b, topic, 2))[1]
        assert copy.key is not None
        await b.send([(topic, copy.key, copy.value, list(copy.headers.items()))])
        [d] = await b.fetch(["default"], 1, 60.0, 0)
        assert d.id == twice.id
        assert await b.fetch(["default"], 10, 60.0, 0) == []
        info = await b.get(cancelled.id)
        assert info is not None and info.state is dw.State.CANCELLED
    finally:
        await b.close()
