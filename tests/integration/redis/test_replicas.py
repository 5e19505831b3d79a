"""``?wait_replicas=N``: an enqueue (or publish) returns once N replicas have its writes."""

from __future__ import annotations

from pathlib import Path

import pytest
import redis

from dumbwaiter.brokers import from_url
from dumbwaiter.brokers.types import Binding
from dumbwaiter.errors import BrokerError
from tests.conformance.conftest import msg
from tests.conformance.helpers import eventually
from tests.conformance.test_events import event
from tests.integration.serverproc import free_port

from .conftest import RedisServer


def _synced(replica: RedisServer) -> bool:
    client = redis.Redis(port=replica.port)
    try:
        return client.info("replication").get("master_link_status") == "up"
    finally:
        client.close()


async def test_enqueue_waits_for_replicas(redis_server: RedisServer, tmp_path: Path) -> None:
    (tmp_path / "replica").mkdir()
    replica = RedisServer(
        tmp_path / "replica", free_port(), "--replicaof", "127.0.0.1", str(redis_server.port)
    )
    replica.start()
    try:

        async def up() -> bool:
            return _synced(replica)

        await eventually(up, bool)
        one = from_url(redis_server.url(wait_replicas="1"))
        two = from_url(redis_server.url(wait_replicas="2", wait_timeout="0.2"))
        try:
            m = msg()
            assert await one.enqueue([m]) == [m.id]
            client = redis.Redis(port=replica.port)
            try:  # the replica has it when enqueue returns
                assert client.exists(f"{{dw:t}}:job:{m.id}")
            finally:
                client.close()
            late = msg()
            with pytest.raises(BrokerError, match="only 1 of 2 replicas"):
                await two.enqueue([late])
            assert await two.get(late.id) is not None  # stored on the primary all the same
            ids = await one.enqueue([msg() for _ in range(2500)])  # staged bulk: WAIT after commit
            assert len(ids) == 2500
            # events: the publish waits too, on both paths
            await one.declare(["group:g"], [Binding("order.created", "group:g")])
            e = event()
            assert await one.publish([e]) == 1
            client = redis.Redis(port=replica.port)
            try:  # the replica has it when publish returns
                assert client.xlen("{dw:t}:ev:order.created") == 1
            finally:
                client.close()
            assert one.publish_sync([event()]) == 1
            with pytest.raises(BrokerError, match="only 1 of 2 replicas"):
                await two.publish([event()])
            with pytest.raises(BrokerError, match="only 1 of 2 replicas"):
                two.publish_sync([event()])
        finally:
            await one.close()
            await two.close()
    finally:
        replica.stop()
