"""Names and shapes of everything the RabbitMQ broker declares.

For one logical queue ``Q`` under the prefix ``P``:

* ``P.q.Q``: the main lane (priority 0, the usual case);
* ``P.p.Q`` / ``P.n.Q``: the lanes of jobs with a priority above / below 0,
  made when the first such job comes.  A fetch drains high, main, low in that
  order; within a lane jobs are first come, first served.  (Quorum queues of
  RabbitMQ 3.x have no priorities, and a classic ``x-max-priority`` queue
  keeps a backing queue and its index files per level: hundreds of them ran
  the server out of file handles.)
* ``P.dlq.Q``: the dead-letter queue, bound to the ``P.dlx`` exchange with
  routing key ``Q``; every lane dead-letters there natively too.

All are quorum queues (``queue_type=classic`` makes them classic).

Events go through ``P.events`` (a topic exchange by default) to each group's
main lane, bound by the group's event type patterns.

Delays need no plugin: a binary cascade of ``LEVELS`` quorum queues (shared
by every app of the vhost, named ``D.N``) each holding messages for a fixed
``UNIT * 2**N`` seconds and dead-lettering them onward.  A message delayed by
``n`` units carries the bits of ``n`` as the first words of its routing key,
then the name of the lane it is for; level ``N``'s exchange sends it into the
level's queue when bit ``N`` is set and straight on when it is not, so it
rests in exactly the levels of its set bits.  The last exchange routes it by
the rest of the routing key into its lane.

The jobs' records and the broker's other entries in the state store are
named by ``Keys``, all under ``_rmq.P:``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

#: seconds of one delay unit (delays are rounded up to it)
UNIT = 0.05
#: levels of the cascade: the longest single pass is UNIT * (2**LEVELS - 1) s
#: (38 days); a longer eta passes again (the fetch checks the due time)
LEVELS = 26

#: lanes of a queue in the order a fetch drains them: high, main, low
HIGH, MAIN, LOW = "p", "q", "n"
LANES = (HIGH, MAIN, LOW)


@dataclass(frozen=True, slots=True)
class Topology:
    """The names of one app's queues, exchanges and delay cascade."""

    prefix: str
    delays: str
    queue_type: str = "quorum"

    def lane(self, queue: str, lane: str = MAIN) -> str:
        return f"{self.prefix}.{lane}.{queue}"

    def lanes(self, queue: str) -> list[str]:
        return [self.lane(queue, lane) for lane in LANES]

    def dlq(self, queue: str) -> str:
        return f"{self.prefix}.dlq.{queue}"

    @property
    def dlx(self) -> str:
        return f"{self.prefix}.dlx"

    @property
    def events(self) -> str:
        return f"{self.prefix}.events"

    def level(self, n: int) -> str:
        """The exchange of delay level ``n`` (-1: the exit into the lanes)."""
        return f"{self.delays}.x{n}" if n >= 0 else f"{self.delays}.out"

    def level_queue(self, n: int) -> str:
        return f"{self.delays}.{n}"


class Keys:
    """Key names in the state store, under this app's prefix (user keys of
    the kv seam pass through unprefixed and never start with ``_rmq``)."""

    def __init__(self, prefix: str) -> None:
        base = f"_rmq.{prefix}:"
        self.job = base + "job:"
        self.key = base + "key:"
        self.lease = base + "lease:"
        self.paused = base + "paused:"
        self.queue = base + "queue:"
        self.lane = base + "lane:"
        self.dlq = base + "dlq:"
        self.binding = base + "bind:"
        self.event = base + "event:"
        self.log = base + "log:"
        self.claim = base + "claim:"

    def log_prefix(self, event_type: str) -> str:
        return f"{self.log}{event_type}\x1f"


def lane_of(priority: int) -> str:
    """The lane a job of ``priority`` goes to."""
    if priority > 0:
        return HIGH
    if priority < 0:
        return LOW
    return MAIN


def delay_units(seconds: float) -> int:
    """Whole units covering ``seconds`` (never early), capped at one pass."""
    if seconds <= 0:
        return 0
    units: int = math.ceil(seconds / UNIT - 1e-9)
    return min(units, (1 << LEVELS) - 1)


def delay_key(units: int, target: str) -> str:
    """Routing key of a delayed message: the bits of ``units``, most
    significant first, then the lane it is for."""
    bits = ".".join("1" if units >> n & 1 else "0" for n in range(LEVELS - 1, -1, -1))
    return f"{bits}.{target}"


def level_pattern(n: int, bit: str) -> str:
    """Topic pattern matching keys whose bit ``n`` is ``bit``."""
    return "*." * (LEVELS - 1 - n) + bit + ".#"


def exit_pattern(target: str) -> str:
    return "*." * LEVELS + target


def topic_matches(pattern: str, key: str) -> bool:
    """AMQP topic matching (``*`` one word, ``#`` zero or more)."""
    p, k = pattern.split("."), key.split(".")

    def go(i: int, j: int) -> bool:
        if i == len(p):
            return j == len(k)
        if p[i] == "#":
            return any(go(i + 1, jj) for jj in range(j, len(k) + 1))
        if j == len(k):
            return False
        return (p[i] == "*" or p[i] == k[j]) and go(i + 1, j + 1)

    return go(0, 0)
