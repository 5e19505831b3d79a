"""``kv_update`` on SQLite is one transaction: concurrent read-modify-writes
from several connections (processes, in production) never lose an update."""

from __future__ import annotations

import asyncio
from pathlib import Path

from dumbwaiter.brokers import from_url


async def test_concurrent_updates_of_one_key_are_serialized(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/kv.db"
    brokers = [from_url(url) for _ in range(4)]
    for b in brokers:
        await b.open()

    def bump(got: dict[str, bytes]) -> tuple[dict[str, bytes], int]:
        n = int(got.get("counter", b"0")) + 1
        return {"counter": str(n).encode()}, n

    try:
        seen = await asyncio.gather(*(b.kv_update(["counter"], bump) for b in brokers * 25))
        # a kv_get then a kv_set would let two callers read the same value
        assert sorted(seen) == list(range(1, 101))
        assert await brokers[0].kv_get(["counter"]) == {"counter": b"100"}
    finally:
        for b in brokers:
            await b.close()
