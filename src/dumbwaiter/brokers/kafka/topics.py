"""The topics one process made, and what each was made with.

A topic is made once per process (creating one that exists is a round trip
that changes nothing), so the broker remembers what it made.  A cluster
that loses its topics (a server keeping nothing over a restart: tansu; a
cluster rebuilt under a running app) would leave that memory wrong, and the
workers' consumer groups subscribed to topics that no longer exist: so a
fetching process looks now and then (``CHECK_EVERY``) which of its topics
the cluster still lists, and makes the missing ones again with what they
were first made with.  Their copies are gone with them; the reconcile
(``jobs.reconcile``) writes the copies of jobs whose records still wait.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable

from .connection import Link

log = logging.getLogger("dumbwaiter.kafka")

#: seconds between two looks at which topics the cluster still has
CHECK_EVERY = 5.0

#: partitions and topic configs a topic is made with
Spec = tuple[int, dict[str, str]]


class Topics:
    """What this process made (see the module docstring)."""

    def __init__(self, replication: int) -> None:
        self.replication = replication
        self.made: dict[str, Spec] = {}
        self._check_at = 0.0

    def __contains__(self, topic: str) -> bool:
        return topic in self.made

    async def ensure(self, link: Link, specs: Iterable[tuple[str, Spec]]) -> None:
        """Make the topics of ``specs`` this process has not made yet."""
        new = {t: spec for t, spec in specs if t not in self.made}
        if not new:
            return
        await link.create_topics([(t, p, self.replication, c) for t, (p, c) in new.items()])
        self.made.update(new)

    def check_soon(self) -> None:
        """Look at the next ``check`` (a write failed: its topic may be gone)."""
        self._check_at = 0.0

    async def check(self, link: Link) -> list[str]:
        """Make again the topics made here that the cluster lost (at most
        every ``CHECK_EVERY`` seconds); returns them."""
        now = time.monotonic()
        if now < self._check_at or not self.made:
            return []
        self._check_at = now + CHECK_EVERY
        listed = set(await (await link.admin()).list_topics())
        lost = {t: spec for t, spec in self.made.items() if t not in listed}
        if not lost:
            return []
        log.warning(
            "kafka: the cluster lost %d topics of this app (%s); making them again",
            len(lost),
            ", ".join(sorted(lost)[:5]),
        )
        for t in lost:
            del self.made[t]
        await self.ensure(link, lost.items())
        return sorted(lost)
