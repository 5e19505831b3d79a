"""Topic, group and record-key names of one app (``prefix``).

Kafka topic names allow ``[A-Za-z0-9._-]`` and at most 249 characters, and
queue names are free text: any other character is written ``_XX`` (its
UTF-8 bytes in hex, ``_`` itself too), so two queues never share a topic.
"""

from __future__ import annotations

import hashlib
import re

_SAFE = re.compile(rb"[A-Za-z0-9.\-]")
#: Kafka's limit on a topic name
MAX_TOPIC = 249

#: seconds each delay tier holds a copy at most (``delay.py``): a copy due
#: in ``r`` seconds enters the largest tier not longer than ``r``
TIERS: tuple[float, ...] = (0.5, 2.0, 8.0, 32.0, 128.0, 512.0, 2048.0, 8192.0, 32768.0)


def safe(text: str) -> str:
    """``text`` as a piece of a topic name (see the module docstring)."""
    return "".join(
        chr(b) if _SAFE.fullmatch(bytes([b])) else f"_{b:02x}" for b in text.encode("utf-8")
    )


class Names:
    """Every name one app (``prefix``) uses in Kafka and in the state store."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        #: groups
        self.jobs_group = f"{prefix}.jobs"
        self.relay_group = f"{prefix}.relay"
        #: the one-partition topic where processes announce their state store
        self.state = f"{prefix}.state"
        # state-store keys (user keys of the kv seam never start with ``_kafka``)
        base = f"_kafka.{prefix}:"
        self.job = base + "job:"
        self.key = base + "key:"
        self.lease = base + "lease:"
        self.paused = base + "paused:"
        self.queue = base + "queue:"
        self.binding = base + "bind:"
        self.event = base + "event:"
        self.etype = base + "etype:"
        self.keylock = base + "keylock:"
        #: the lock of the process that looks for stranded jobs
        self.reconciler = base + "reconciler"
        #: the delay tiers' topics
        self.tiers = frozenset(self.tier_topic(i) for i in range(len(TIERS)))
        # topic names made (each copy written names its topic: made once)
        self._made: dict[tuple[str, str], str] = {}

    def keylock_of(self, queue: str, key: str) -> str:
        """The entry naming the delivery of ``key`` a group ``queue`` runs now."""
        return f"{self.keylock}{queue}\x1f{key}"

    def _topic(self, kind: str, name: str) -> str:
        topic = self._made.get((kind, name))
        if topic is None:
            topic = f"{self.prefix}.{kind}.{safe(name)}"
            if len(topic) > MAX_TOPIC:  # still one topic per name: a digest tells them apart
                digest = hashlib.sha256(name.encode()).hexdigest()[:16]
                topic = f"{topic[: MAX_TOPIC - 17]}-{digest}"
            self._made[(kind, name)] = topic
        return topic

    def queue_topic(self, queue: str) -> str:
        return self._topic("q", queue)

    def dlq_topic(self, queue: str) -> str:
        return self._topic("dlq", queue)

    def event_topic(self, event_type: str) -> str:
        return self._topic("ev", event_type)

    def tier_topic(self, tier: int) -> str:
        return f"{self.prefix}.delay.{tier}"

    def group_of(self, queue: str) -> str:
        """The consumer group of a subscriber group's queue on its event topics."""
        return f"{self.prefix}.sub.{safe(queue)}"


def tier_for(remaining: float) -> int:
    """The delay tier a copy due in ``remaining`` seconds enters."""
    tier = 0
    for i, hold in enumerate(TIERS):
        if hold <= remaining:
            tier = i
    return tier
