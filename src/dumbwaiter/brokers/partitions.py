"""Consumer lag per partition: what an engine whose queues are partitioned
logs (Kafka) reports beside the per-queue counts.

A queue's record counts say how many jobs wait; on a log they do not say
where: one partition may be far behind (its consumer slow, or the one key
that fills it), the others caught up.  Each row is one partition of one
queue's topic: its end offset, the offset the workers' consumer group
committed (the first copy not judged yet) and the difference.  Engines
without partitions report none (``Broker.partition_lag``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class PartitionLag:
    """One partition of a queue as its consumer group sees it."""

    queue: str
    partition: int
    #: one past the last record written
    end: int
    #: the group's committed offset (0 when it never committed)
    committed: int

    @property
    def lag(self) -> int:
        """Copies written and not judged yet."""
        return max(0, self.end - self.committed)

    def to_dict(self) -> dict[str, Any]:
        return {
            "queue": self.queue,
            "partition": self.partition,
            "end": self.end,
            "committed": self.committed,
            "lag": self.lag,
        }
