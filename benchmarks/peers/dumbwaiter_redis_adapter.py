"""dumbwaiter on its Redis broker in the peers harness, next to the Redis
peers on the same server and database (the harness' ``REDIS_URL``, db 1,
which the harness flushes before and after every run; db 0 is never touched).

The keys live under dumbwaiter's prefix ``{dw:bench}``; ``reset`` is the
harness' own ``redis_flush()`` (``FLUSHDB`` on db 1), as for the peers.

Worker side: ``dumbwaiter worker --app dumbwaiter_redis_adapter:redis_app``.
"""

from __future__ import annotations

from dumbwaiter_adapter import DumbwaiterAdapter, _app
from peers.adapters.base import Adapter
from peers.common import REDIS_URL, redis_client, redis_flush

PREFIX = "bench"
REDIS_APP_URL = f"{REDIS_URL}?prefix={PREFIX}"

# Creating an App opens no connection until first use.
redis_app, REDIS_TASKS = _app(REDIS_APP_URL)


class DumbwaiterRedisAdapter(DumbwaiterAdapter):
    """Lua scripts per transition; idle workers block in BLPOP on a wake list."""

    dists = ("dumbwaiter", "orjson", "redis", "hiredis")
    bulk_api = (
        "task.enqueue_many(ids) (chunks of 1,000 jobs staged while the next is encoded, "
        "then one commit script)"
    )
    notes = (
        "Redis (redis-py connections with hiredis, driven directly), prefix {dw:bench} in db 1; "
        "sync producer on a blocking socket, one EVALSHA per enqueue; every transition one Lua "
        "script (batched claims, acks, lease extensions); jobs kept 1 h after they finish, as in "
        "production."
    )

    def __init__(self) -> None:
        super().__init__("dumbwaiter-redis", "redis", REDIS_APP_URL, "redis_app")

    def worker_cmd(self, concurrency: int) -> list[str]:
        # the base class names its own module in --app; the App is defined here
        cmd = super().worker_cmd(concurrency)
        cmd[cmd.index("--app") + 1] = f"{__name__}:{self.app_attr}"
        return cmd

    def reset(self) -> None:
        redis_flush()

    def pending(self) -> int | None:
        r = redis_client()
        try:
            return int(r.zcard(f"{{dw:{PREFIX}}}:ready:default"))
        finally:
            r.close()


ADAPTERS: list[Adapter] = [DumbwaiterRedisAdapter()]
