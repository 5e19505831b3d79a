"""What a ``sqlite:///PATH`` URL may say."""

from __future__ import annotations

from urllib.parse import urlsplit

from ...errors import InvalidURL
from ...redact import mask_url
from .. import urlopts

#: finished jobs (without a kept result) are pruned after this many seconds
DEFAULT_RETENTION = 3600.0
#: the URL's ``synchronous`` -> SQLite's PRAGMA value
SYNC = {"off": "OFF", "normal": "NORMAL", "full": "FULL", "extra": "EXTRA"}

SYNCHRONOUS = urlopts.choice(
    "synchronous",
    "full",
    list(SYNC),
    "producer commits: full fsyncs each enqueue; normal does not",
)
RETENTION = urlopts.seconds("retention", DEFAULT_RETENTION, "seconds finished jobs stay visible")
BUSY_TIMEOUT = urlopts.seconds(
    "busy_timeout", 30.0, "seconds a connection waits for the write lock"
)
OPTIONS = urlopts.Table("sqlite", [SYNCHRONOUS, RETENTION, BUSY_TIMEOUT], check_hosts=False)


def parse_url(url: str) -> tuple[str, urlopts.Values]:
    """``sqlite:///rel.db`` is relative, ``sqlite:////abs.db`` absolute."""
    parts = urlsplit(url)
    if parts.scheme != "sqlite":
        raise InvalidURL(f"not a sqlite URL: {mask_url(url)!r}")
    if parts.netloc:
        raise InvalidURL(
            f"sqlite URL {mask_url(url)!r} has a host part ({mask_url(parts.netloc)!r}); "
            "write sqlite:///relative.db or sqlite:////absolute/path.db"
        )
    path = parts.path[1:] if parts.path.startswith("/") else parts.path
    if not path or path == ":memory:":
        raise InvalidURL(
            f"sqlite URL {mask_url(url)!r} names no database file (an in-memory database cannot be "
            "shared by workers; use memory:// for tests)"
        )
    return path, OPTIONS.parse(url)
