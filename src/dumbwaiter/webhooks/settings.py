"""How deliveries are made (``app.webhooks.configure(...)``), apart from the
service that applies them, so the deliverer reads them without importing it."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..brokers.base import DEFAULT_EVENT_RETENTION
from ..retry import Retry
from .breaker import BreakerPolicy

#: the retry schedule of the Standard Webhooks specification: after the first
#: try, 5 s, 5 min, 30 min, 2 h, 5 h, 10 h, 14 h, 20 h, 24 h (about 3 days)
SPEC_SCHEDULE = (5.0, 300.0, 1800.0, 7200.0, 18000.0, 36000.0, 50400.0, 72000.0, 86400.0)
SPEC_RETRY = Retry(attempts=len(SPEC_SCHEDULE) + 1, backoff=SPEC_SCHEDULE, jitter=0.2)


@dataclass(frozen=True, slots=True)
class Settings:
    """``app.webhooks.configure(...)``: how deliveries are made."""

    queue: str = "webhooks"
    #: the subscriber group that fans forwarded events out to endpoints
    group: str = "webhooks"
    retry: Retry = SPEC_RETRY
    #: seconds to wait for a receiver (read and write); connecting gets ``connect_timeout``
    timeout: float = 15.0
    connect_timeout: float = 5.0
    #: let deliveries reach private, loopback, link-local... addresses (tests, intranets)
    allow_private: bool = False
    #: networks allowed though not public (``["10.20.0.0/16"]``)
    allow: tuple[str, ...] = ()
    breaker: BreakerPolicy = field(default_factory=BreakerPolicy)
    #: how long a delivered webhook's job and attempt log are kept (seconds)
    retention: float = DEFAULT_EVENT_RETENTION
    #: concurrency of a new endpoint when ``add_endpoint`` gets none (None: unlimited)
    default_concurrency: int | None = 10
    #: connections one worker loop keeps open to one origin (scheme, host, port)
    max_connections: int = 200
