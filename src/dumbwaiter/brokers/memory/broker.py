"""``memory://`` and ``memory://NAME``: the URL, and the parts put together."""

from __future__ import annotations

from typing import ClassVar
from urllib.parse import urlsplit

from .. import urlopts
from ..types import Capabilities
from .admin import Admin
from .coordination import Coordination
from .store import Store, named
from .transport import Transport

#: finished jobs without a kept result stay visible this long (seconds)
DEFAULT_RETENTION = 3600.0

RETENTION = urlopts.seconds("retention", DEFAULT_RETENTION, "seconds finished jobs stay visible")
OPTIONS = urlopts.Table("memory", [RETENTION], check_hosts=False)


class MemoryBroker(Transport, Admin, Coordination):
    """In-process broker.  ``memory://`` is private to one broker object;
    ``memory://NAME`` is shared by every broker of that name in the process.
    ``?retention=SECONDS`` is its one option (the ``retention`` argument wins)."""

    capabilities: ClassVar[Capabilities] = Capabilities(
        sync_enqueue=True, multi_process=False, events=True, limits=True, native_capacity=True
    )
    schemes: ClassVar[tuple[str, ...]] = ("memory",)

    def __init__(self, url: str = "memory://", retention: float | None = None) -> None:
        super().__init__(url)
        opts = OPTIONS.parse(url)
        parts = urlsplit(url)
        name = parts.netloc + parts.path
        self.store = named(name) if name else Store()
        self.retention = opts[RETENTION] if retention is None else retention
