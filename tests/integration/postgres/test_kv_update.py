"""``kv_update`` on PostgreSQL against a plain writer of the same key."""

from __future__ import annotations

from collections.abc import Callable

import psycopg
from psycopg import sql

from dumbwaiter.brokers.postgres import PostgresBroker
from tests.integration.postgres import server


async def test_a_key_created_between_the_read_and_the_write_makes_it_decide_again(
    make_broker: Callable[..., PostgresBroker], schema: str
) -> None:
    """A plain writer (``kv_add``: another process) creates a key the update
    read as absent, after the read and before the write.  The update must
    not overwrite it with a decision made on "absent": it runs again and
    decides on the value now there.  (A row lock cannot hold off a row that
    does not exist yet; the advisory lock only holds off other updates.)"""
    b = make_broker()
    await b.open()
    seen: list[dict[str, bytes]] = []

    def decide(got: dict[str, bytes]) -> tuple[dict[str, bytes], int]:
        seen.append(dict(got))
        if len(seen) == 1:  # the other process writes now (its own connection)
            with psycopg.connect(server.SERVER, autocommit=True) as other:
                other.execute(
                    sql.SQL("INSERT INTO {}.dw_kv (key, value) VALUES ('slot', '5')").format(
                        sql.Identifier(schema)
                    )
                )
        n = int(got.get("slot", b"0")) + 1
        return {"slot": str(n).encode()}, n

    assert await b.kv_update(["slot"], decide) == 6
    assert seen == [{}, {"slot": b"5"}]
    assert await b.kv_get(["slot"]) == {"slot": b"6"}
