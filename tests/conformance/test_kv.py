"""Coordination: the small key-value store (schedules, workflows, batches)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from dumbwaiter.brokers.base import Broker, KvWrite

from .helpers import eventually


async def test_set_get_delete(broker: Broker) -> None:
    await broker.kv_set({"a": b"1", "b": b"\x00\xff"})
    assert await broker.kv_get(["a", "b", "c"]) == {"a": b"1", "b": b"\x00\xff"}
    await broker.kv_set({"a": b"2"})
    assert await broker.kv_get(["a"]) == {"a": b"2"}
    assert await broker.kv_delete(["a", "c"]) == 1
    assert await broker.kv_get(["a"]) == {}


async def test_add_only_if_absent(broker: Broker) -> None:
    assert await broker.kv_add("tick:1", b"x")
    assert not await broker.kv_add("tick:1", b"y")
    assert await broker.kv_get(["tick:1"]) == {"tick:1": b"x"}


async def test_ttl_expires(broker: Broker) -> None:
    await broker.kv_set({"short": b"1"}, ttl=0.2)
    assert await broker.kv_add("lease", b"1", ttl=0.2)
    await eventually(lambda: broker.kv_get(["short", "lease"]), lambda d: d == {})
    assert await broker.kv_add("lease", b"2")  # free again once expired


async def test_incr_is_atomic(make_broker: Callable[[], Broker]) -> None:
    brokers = [make_broker() for _ in range(4)]
    for b in brokers:
        await b.open()
    results = await asyncio.gather(*(b.kv_incr("chord:x") for b in brokers for _ in range(25)))
    assert sorted(results) == list(range(1, 101))  # every increment seen once
    assert await brokers[0].kv_incr("chord:x", -100) == 0
    assert await brokers[0].kv_get(["chord:x"]) == {"chord:x": b"0"}


async def test_update_reads_decides_and_writes(broker: Broker) -> None:
    """``kv_update``: ``decide`` sees the live values of the keys asked for
    (absent ones left out), what it returns is stored, its result returned."""
    await broker.kv_set({"rec:a": b"1", "rec:b": b"2"})
    seen: list[dict[str, bytes]] = []

    def decide(got: dict[str, bytes]) -> tuple[dict[str, bytes], int]:
        seen.append(dict(got))
        return {k: bytes(v) + b"+" for k, v in got.items()} | {"rec:new": b"n"}, len(got)

    assert await broker.kv_update(["rec:a", "rec:b", "rec:c"], decide) == 2
    assert seen[-1] == {"rec:a": b"1", "rec:b": b"2"}
    assert await broker.kv_get(["rec:a", "rec:b", "rec:c", "rec:new"]) == {
        "rec:a": b"1+",
        "rec:b": b"2+",
        "rec:new": b"n",
    }
    assert await broker.kv_update(["rec:c"], lambda got: ({}, got)) == {}  # nothing to write


async def test_update_writes_expire_after_their_ttl(broker: Broker) -> None:
    """A value ``decide`` returns as ``(bytes, ttl)`` lives ``ttl`` seconds (a
    key read or only written, one that had no expiry before); plain bytes
    live on, even over a key that had an expiry (a new holder's entry must
    not expire with its predecessor's); an expired key is absent to
    ``kv_add`` and to the next update."""
    await broker.kv_set({"upd:read": b"0", "upd:renewed": b"0"}, ttl=0.2)
    await broker.kv_set({"upd:kept": b"0"})

    def decide(got: dict[str, bytes]) -> tuple[dict[str, KvWrite], int]:
        return {
            "upd:read": (b"1", 0.2),
            "upd:kept": (b"1", 0.2),
            "upd:new": (b"1", 0.2),
            "upd:renewed": b"forever",
            "upd:none": (b"1", None),
        }, len(got)

    assert await broker.kv_update(["upd:read", "upd:kept", "upd:renewed"], decide) == 3
    short = ["upd:read", "upd:kept", "upd:new"]
    await eventually(lambda: broker.kv_get(short), lambda d: d == {})
    assert await broker.kv_get([*short, "upd:renewed", "upd:none"]) == {
        "upd:renewed": b"forever",
        "upd:none": b"1",
    }
    assert await broker.kv_add("upd:new", b"again")
    seen = await broker.kv_update(["upd:read", "upd:new"], lambda got: ({}, dict(got)))
    assert seen == {"upd:new": b"again"}


async def test_concurrent_updates_never_lose_one(make_broker: Callable[[], Broker]) -> None:
    """``kv_update`` is a read-modify-write that no other ``kv_update`` (of this
    broker object, another one, another process) can come in between: 100
    concurrent increments of one key from four brokers each see a different
    count and end at 100.  (A ``kv_get`` then a ``kv_set`` lets many read the
    same count and all but one increment are lost.)"""
    brokers = [make_broker() for _ in range(4)]
    for b in brokers:
        await b.open()

    def bump(got: dict[str, bytes]) -> tuple[dict[str, bytes], int]:
        n = int(got.get("upd:n", b"0")) + 1
        return {"upd:n": str(n).encode()}, n

    seen = await asyncio.gather(*(b.kv_update(["upd:n"], bump) for b in brokers * 25))
    assert sorted(seen) == list(range(1, 101))
    assert await brokers[0].kv_get(["upd:n"]) == {"upd:n": b"100"}


async def test_concurrent_transfers_keep_the_sum(make_broker: Callable[[], Broker]) -> None:
    """A two-key update is atomic: concurrent transfers between two keys (one
    absent at first) from four brokers each see the two keys as one moment
    (their sum is always 100) and none is lost (the end state counts every
    transfer)."""
    brokers = [make_broker() for _ in range(4)]
    for b in brokers:
        await b.open()
    await brokers[0].kv_set({"acct:a": b"100"})

    def move(src: str, dst: str) -> Callable[[dict[str, bytes]], tuple[dict[str, bytes], int]]:
        def decide(got: dict[str, bytes]) -> tuple[dict[str, bytes], int]:
            have = {k: int(got.get(k, b"0")) for k in ("acct:a", "acct:b")}
            seen = have["acct:a"] + have["acct:b"]
            have[src] -= 1
            have[dst] += 1
            return {src: str(have[src]).encode(), dst: str(have[dst]).encode()}, seen

        return decide

    a_to_b, b_to_a = move("acct:a", "acct:b"), move("acct:b", "acct:a")
    calls = [
        b.kv_update(["acct:a", "acct:b"], a_to_b if i % 3 else b_to_a)
        for i, b in enumerate(brokers * 15)
    ]
    sums = await asyncio.gather(*calls)
    assert set(sums) == {100}  # every decide saw both keys at one moment
    n_ab = sum(1 for i in range(60) if i % 3)
    expected = {"acct:a": 100 - n_ab + (60 - n_ab), "acct:b": n_ab - (60 - n_ab)}
    got = await brokers[0].kv_get(["acct:a", "acct:b"])
    assert {k: int(v) for k, v in got.items()} == expected


async def test_update_known_stores_the_decision_on_the_live_values(broker: Broker) -> None:
    """``kv_update_known``: a caller's belief about the keys is only a
    guess: where it is right the decision made on it is stored; where it is
    wrong (a key changed, one believed absent exists, one believed there is
    gone) what is stored and returned is the decision on the live values."""
    await broker.kv_set({"kn:a": b"1", "kn:b": b"2"})

    def bump(got: dict[str, bytes]) -> tuple[dict[str, bytes], dict[str, bytes]]:
        return {k: b"%d" % (int(got.get(k, b"0")) + 10) for k in ("kn:a", "kn:b", "kn:c")}, got

    right = {"kn:a": b"1", "kn:b": b"2", "kn:c": None}
    assert await broker.kv_update_known(["kn:a", "kn:b", "kn:c"], bump, right) == {
        "kn:a": b"1",
        "kn:b": b"2",
    }
    now = {"kn:a": b"11", "kn:b": b"12", "kn:c": b"10"}
    assert await broker.kv_get(["kn:a", "kn:b", "kn:c"]) == now

    await broker.kv_set({"kn:b": b"50"})  # changed since the caller wrote it
    await broker.kv_delete(["kn:c"])
    await broker.kv_set({"kn:d": b"7"})
    stale = {"kn:a": b"11", "kn:b": b"12", "kn:c": b"10", "kn:d": None}
    seen = await broker.kv_update_known(["kn:a", "kn:b", "kn:c", "kn:d"], bump, stale)
    assert seen == {"kn:a": b"11", "kn:b": b"50", "kn:d": b"7"}
    assert await broker.kv_get(["kn:a", "kn:b", "kn:c"]) == {
        "kn:a": b"21",
        "kn:b": b"60",
        "kn:c": b"10",
    }
    # a decision to write nothing, made on a wrong belief, is made again
    got = await broker.kv_update_known(["kn:a"], lambda got: ({}, dict(got)), {"kn:a": None})
    assert got == {"kn:a": b"21"}


async def test_concurrent_known_updates_never_lose_one(make_broker: Callable[[], Broker]) -> None:
    """Updates that all believe the key still holds its first value, from
    four brokers at once: each but the first is wrong, and each increment
    is still counted once."""
    brokers = [make_broker() for _ in range(4)]
    for b in brokers:
        await b.open()
    await brokers[0].kv_set({"kn:n": b"0"})

    def bump(got: dict[str, bytes]) -> tuple[dict[str, bytes], int]:
        n = int(got.get("kn:n", b"0")) + 1
        return {"kn:n": str(n).encode()}, n

    seen = await asyncio.gather(
        *(b.kv_update_known(["kn:n"], bump, {"kn:n": b"0"}) for b in brokers * 10)
    )
    assert sorted(seen) == list(range(1, 41))


async def test_scan_by_prefix(broker: Broker) -> None:
    await broker.kv_set({"sched:a": b"1", "sched:b": b"2", "other": b"3"})
    assert await broker.kv_scan("sched:") == {"sched:a": b"1", "sched:b": b"2"}
    assert await broker.kv_scan("none:") == {}


async def test_set_add_counts_members_once(make_broker: Callable[[], Broker]) -> None:
    brokers = [make_broker() for _ in range(4)]
    for b in brokers:
        await b.open()
    sizes = await asyncio.gather(
        *(b.kv_sadd("chord:c1", str(i % 4), ttl=60) for i, b in enumerate(brokers * 5))
    )
    assert max(sizes) == 4 and sizes.count(4) >= 1  # 4 distinct members, added 20 times
    assert await brokers[0].kv_sadd("chord:c1", "0") == 4  # idempotent
    finals = await asyncio.gather(*(b.kv_sadd("chord:c2", str(i)) for i, b in enumerate(brokers)))
    # the last add always sees the whole set (a chord's last member fires it)
    assert 4 in finals and all(1 <= n <= 4 for n in finals)
    assert await brokers[0].kv_smembers("chord:c2") == {"0", "1", "2", "3"}
    assert await brokers[0].kv_smembers("chord:none") == set()
