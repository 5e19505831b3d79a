"""How a consumer group shares partitions: a worker keeps the partitions it
is busy with.

Kafka's own assignors (range, round-robin) deal the partitions out afresh at
every rebalance.  For dumbwaiter that moves a partition away from the worker
running its jobs for no gain: the new owner reads the copies after the
committed mark again and judges them by their records (the running ones are
dropped), and for a group's events with a key (``capabilities.ordered_keys``)
the key's next event would wait on a worker that cannot see when the
running one ends.  So each member tells the group, in its join metadata, the
partitions it holds and those where it runs jobs now; the leader keeps each
busy partition with its worker, then each held one while its worker is under
its fair share, and deals the rest out to the members with the fewest.
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import orjson
from aiokafka.coordinator.assignors.abstract import AbstractPartitionAssignor
from aiokafka.coordinator.protocol import (
    ConsumerProtocolMemberAssignment,
    ConsumerProtocolMemberMetadata,
)

#: (held, busy) partitions of one member, as (topic, partition) pairs
Holdings = Callable[[], tuple[set[tuple[str, int]], set[tuple[str, int]]]]


class BusyFirstAssignor(AbstractPartitionAssignor):  # type: ignore[misc]
    """The assignor (see the module docstring); ``for_reader`` makes the class
    of one consumer, whose ``holdings`` says what it holds."""

    name = "dw-busy-first"
    version = 0
    holdings: Holdings = staticmethod(lambda: (set(), set()))

    @classmethod
    def for_reader(cls, holdings: Holdings) -> type[BusyFirstAssignor]:
        return type("BusyFirstAssignor", (cls,), {"holdings": staticmethod(holdings)})

    @classmethod
    def metadata(cls, topics: Iterable[str]) -> Any:
        held, busy = cls.holdings()
        data = orjson.dumps({"held": sorted(held), "busy": sorted(busy)})
        return ConsumerProtocolMemberMetadata(cls.version, sorted(topics), data)

    @classmethod
    def on_assignment(cls, assignment: Any) -> None:
        return None

    @classmethod
    def assign(cls, cluster: Any, members: Mapping[str, Any]) -> dict[str, Any]:
        subs = {m: set(md.subscription) for m, md in members.items()}
        held: dict[str, set[tuple[str, int]]] = {}
        busy: dict[str, set[tuple[str, int]]] = {}
        for m, md in members.items():
            try:
                d = orjson.loads(md.user_data or b"{}")
            except orjson.JSONDecodeError:
                d = {}
            held[m] = {(str(t), int(p)) for t, p in d.get("held", ())}
            busy[m] = {(str(t), int(p)) for t, p in d.get("busy", ())}
        every: list[tuple[str, int]] = []
        for topic in sorted(set().union(*subs.values()) if subs else set()):
            parts = cluster.partitions_for_topic(topic) or ()
            every += [(topic, p) for p in sorted(parts)]
        owner: dict[tuple[str, int], str] = {}
        count: collections.Counter[str] = collections.Counter()
        fair = -(-len(every) // max(1, len(members)))  # rounded up
        order = sorted(members)
        for wanted, cap in ((busy, None), (held, fair)):
            for m in order:
                for tp in sorted(wanted[m]):
                    if tp in owner or tp[0] not in subs[m] or tp not in set(every):
                        continue
                    if cap is not None and count[m] >= cap:
                        break
                    owner[tp] = m
                    count[m] += 1
        for tp in every:
            if tp in owner:
                continue
            takers = [m for m in order if tp[0] in subs[m]]
            if takers:
                m = min(takers, key=lambda x: (count[x], order.index(x)))
                owner[tp] = m
                count[m] += 1
        out: dict[str, dict[str, list[int]]] = {m: collections.defaultdict(list) for m in members}
        for (topic, p), m in owner.items():
            out[m][topic].append(p)
        return {
            m: ConsumerProtocolMemberAssignment(
                cls.version, sorted((t, sorted(ps)) for t, ps in out[m].items()), b""
            )
            for m in members
        }
