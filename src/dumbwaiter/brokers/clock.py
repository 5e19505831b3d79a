"""The server's clock as one process reads it: leases that hosts agree on.

A lease, a lock's expiry, a rate-limit window or a job's run time is written
by one host and compared by another.  Where the server cannot stamp the time
itself (a Redis script is given its times; JetStream has no per-message
expiry before 2.11), each host would stamp its own wall clock, and a host
whose clock is 30 s ahead would see every live lease as expired (and steal
it), while one 30 s behind would write leases that are over before they
start.

``ServerClock`` reads the server's time now and then (Redis ``TIME``, the
time stamp JetStream gives a message) and carries it forward with this
process's monotonic clock, which no NTP step or ``date -s`` moves.  Every
time the broker writes or compares is then the server's, whatever this host's
wall clock says; a time that comes from above the seam (a job's ``eta``, a
retry's ``retry_at``, a rate permit's stamp) is this host's wall clock, and
``to_server`` moves it by the difference, so "in 10 s" stays "in 10 s".

What remains is the reading's error: half the round trip of the read, plus
the monotonic clock's drift until the next read (``SYNC_EVERY``; a slewing
NTP daemon moves the rate by at most 500 ppm, 15 ms in 30 s).  A host within
``TOLERANCE`` (or the read's round trip) of the server keeps its own clock,
so times it gives (an ``eta``) come back exactly as given.
docs/guarantees.md ("Clock skew") states the bound per broker.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable

log = logging.getLogger("dumbwaiter.brokers.clock")

#: seconds between two reads of the server's time
SYNC_EVERY = 30.0
#: seconds before a read that failed is tried again
RETRY_AFTER = 1.0
#: seconds of difference between this host's clock and the server's that
#: are left alone (an NTP-synced host is within milliseconds)
TOLERANCE = 0.1


class ServerClock:
    """The server's time, read every ``every`` seconds and carried forward
    by the monotonic clock; this host's wall clock until the first read."""

    def __init__(self, every: float = SYNC_EVERY) -> None:
        self.every = every
        self._server: float | None = None  # the server's time at ``_mono``
        self._mono = 0.0
        self._due = 0.0  # monotonic time of the next read
        #: the round trip of the last read: twice the bound of its error
        self.rtt = 0.0

    @property
    def due(self) -> bool:
        """True when the server's time should be read again (or never was)."""
        return time.monotonic() >= self._due

    def now(self) -> float:
        """The server's time now (Unix seconds): this host's wall clock when
        the two agree within what a reading can tell (``offset``)."""
        return time.time() + self.offset()

    def offset(self) -> float:
        """Seconds the server's clock is ahead of this host's; 0.0 when the
        difference is within ``TOLERANCE`` or the last read's round trip (no
        reading tells a smaller one from its own error), so a host in sync
        keeps its own times exactly."""
        if self._server is None:
            return 0.0
        raw = self._server + (time.monotonic() - self._mono) - time.time()
        return 0.0 if abs(raw) <= max(TOLERANCE, self.rtt) else raw

    def to_server(self, t: float) -> float:
        """A time on this host's wall clock (an ``eta``) on the server's."""
        return t + self.offset()

    def observe(self, server: float, sent: float, received: float) -> None:
        """The server answered ``server`` (its time) to a read sent at
        monotonic ``sent`` and answered at ``received``: it read its clock
        between the two, most likely half way."""
        self.rtt = received - sent
        self._server = server
        self._mono = sent + self.rtt / 2
        self._due = received + self.every

    async def sync(self, read: Callable[[], Awaitable[float]]) -> None:
        """Read the server's time with ``read`` if due."""
        if self.due:
            sent = time.monotonic()
            server = await read()
            self.observe(server, sent, time.monotonic())

    async def try_sync(self, read: Callable[[], Awaitable[float]]) -> None:
        """``sync``, for a caller whose own work must not fail with the read
        (a connection being set up, a server failing over): a failed read
        keeps the last reading (or this host's clock) and is tried again
        ``RETRY_AFTER`` s later."""
        try:
            await self.sync(read)
        except Exception as exc:
            self._due = time.monotonic() + RETRY_AFTER
            log.debug("reading the server's clock failed (%r); keeping the last reading", exc)

    def sync_blocking(self, read: Callable[[], float]) -> None:
        """``sync`` for a caller without an event loop."""
        if self.due:
            sent = time.monotonic()
            server = read()
            self.observe(server, sent, time.monotonic())
