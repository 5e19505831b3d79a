"""The sync link's own round trip (connection.py ``_roundtrip``): straight on the
socket and hiredis reader, with redis-py's errors and connection rules."""

from __future__ import annotations

import pytest
import redis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError

from dumbwaiter.brokers import from_url
from dumbwaiter.brokers.redis import RedisBroker


def test_error_reply_keeps_the_connection(shared_url: str) -> None:
    broker = from_url(shared_url)
    assert isinstance(broker, RedisBroker)
    link = broker.conn.sync
    try:
        assert link.call(b"PING") == b"PONG"
        [conn] = link.free
        with pytest.raises(ResponseError):
            link.call(b"NOSUCHCOMMAND")
        assert link.free == [conn]  # the server answered: kept
        big = b"x" * 300_000  # a reply longer than one read
        assert link.call(b"ECHO", big) == big
        assert link.free == [conn]
    finally:
        link.close()


def test_connection_killed_by_the_server_is_dropped(shared_url: str) -> None:
    broker = from_url(shared_url)
    assert isinstance(broker, RedisBroker)
    link = broker.conn.sync
    admin = redis.Redis.from_url(shared_url.split("?")[0])
    try:
        link.call(b"CLIENT", b"SETNAME", b"dw-roundtrip-test")
        [conn] = link.free
        admin.client_kill_filter(_id=str(int(link.call(b"CLIENT", b"ID"))))
        with pytest.raises(RedisConnectionError):
            link.call(b"PING")
        assert link.free == []  # never reused
        assert link.call(b"PING") == b"PONG"  # a new connection
        assert link.free and link.free[0] is not conn
    finally:
        admin.close()
        link.close()
