"""One keyspace of a Redis app: the keys under one hash tag, with the seam's
transport, admin and coordination methods working on them.

Every script of a keyspace touches its keys only, so each call is legal on a
Redis Cluster (one slot) and runs on the node that owns the slot, which the
keyspace's own ``Target`` follows (``MOVED``).  ``RedisBroker`` (broker.py)
puts an app together from keyspaces: the home one, and with
``layout=queues`` one per queue (``layout.py``).
"""

from __future__ import annotations

from typing import ClassVar

from redis.exceptions import RedisError

from ...errors import BrokerError
from ..types import Capabilities
from .admin import Admin
from .capacity import RedisCapacity
from .connection import Connection, Target
from .coordination import Coordination
from .transport import Transport


class Keyspace(RedisCapacity, Transport, Admin, Coordination):
    """The keys under one hash tag, and every seam method on them."""

    capabilities: ClassVar[Capabilities] = Capabilities(
        sync_enqueue=True,
        multi_process=True,
        multi_host=True,
        limits=True,
        events=True,
        native_capacity=True,
        concurrent_fetches=2,
    )
    client_errors: ClassVar[tuple[type[BaseException], ...]] = (RedisError, OSError)

    def __init__(self, url: str, conn: Connection, retention: float) -> None:
        super().__init__(url)
        self.retention = retention
        self.conn = conn
        self.lua = conn.lua
        #: the hash tag every key of this keyspace starts with
        self.prefix = conn.keys.tag

    @classmethod
    def make(cls, url: str, target: Target, name: str, retention: float, **opts: float) -> Keyspace:
        return cls(
            url,
            Connection(
                url,
                target,
                name,
                reconnect=opts["reconnect"],
                wait_replicas=int(opts["wait_replicas"]),
                wait_timeout=opts["wait_timeout"],
            ),
            retention,
        )

    def __repr__(self) -> str:
        return f"<Keyspace {self.prefix}>"

    def failure(
        self, exc: BaseException, what: str = "", waited: float | None = None
    ) -> BrokerError:
        return self.conn.failure(exc, what, waited)

    async def server_time(self) -> float | None:
        return await self.conn.server_time()
