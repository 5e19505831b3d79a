"""``redis://HOST:PORT/DB?prefix=NAME`` (and ``rediss://`` for TLS).

The broker is cut like every engine: ``connection.py`` (the links to the
server, one per event loop, and the sync one), ``transport.py`` (the job's
path), ``admin.py``, ``coordination.py`` (locks, kv, limits); this module
reads the URL and puts the parts together.  Enqueue's batching and retries
are in ``bulk.py``, events in ``events.py``, the scripts in ``lua.py``.

Keys: everything of one app lives under ``{dw:NAME}:`` (``docs/redis.md``
lists them).  The braces are a Redis Cluster hash tag: all of an app's keys
hash to one slot, so multi-key scripts are legal on a cluster, and the
broker follows ``MOVED`` to the node that owns the slot.

Connection loss: an enqueue is sent again, with backoff, until the
producer's deadline (``App(enqueue_timeout=)``), or for ``reconnect``
seconds when no producer call runs it (a job is never stored twice, so
resending a batch whose reply was lost is safe), then raises
``BrokerUnavailable``; every other call fails at once, and the worker's
loops back off and try again.  Refused credentials (``AUTH``) and a
database number the server does not have raise ``BrokerAuthError`` /
``BrokerConfigError`` at once, retried by nobody.
"""

from __future__ import annotations

from typing import ClassVar
from urllib.parse import urlencode, urlsplit, urlunsplit

from redis.exceptions import RedisError

from ...errors import BrokerError, InvalidURL
from ...redact import mask_url
from .. import urlopts
from ..base import Capabilities
from .admin import Admin
from .capacity import RedisCapacity
from .connection import Connection, Target
from .coordination import Coordination
from .transport import Transport

#: finished jobs (without a longer-kept result) are deleted after this many seconds
DEFAULT_RETENTION = 3600.0


def _wait_ms(text: str) -> float:
    """``WAIT`` takes whole milliseconds and ``0`` blocks forever: at least 1 ms."""
    value = float(text)
    if not value >= 0.001 or value == float("inf"):
        raise ValueError(text)
    return value


_TLS = ("rediss",)
PREFIX = urlopts.text(
    "prefix",
    "default",
    "every key of the app starts with {dw:PREFIX}:",
    pattern=r"[^{}]*",
    accepts="a name without braces",
)
RETENTION = urlopts.seconds("retention", DEFAULT_RETENTION, "seconds finished jobs stay visible")
RECONNECT = urlopts.seconds(
    "reconnect", 30.0, "seconds an enqueue keeps trying while the server is unreachable"
)
WAIT_REPLICAS = urlopts.integer(
    "wait_replicas", 0, "an enqueue returns once this many replicas have its writes"
)
WAIT_TIMEOUT = urlopts.custom(
    "wait_timeout",
    1.0,
    "seconds wait_replicas waits before the enqueue fails",
    _wait_ms,
    "a number of seconds of 0.001 or more",
)
SOCKET_TIMEOUT = urlopts.seconds("socket_timeout", 30.0, "seconds a reply may take", positive=True)
CONNECT_TIMEOUT = urlopts.seconds("connect_timeout", 5.0, "seconds to connect", positive=True)
#: what redis-py reads from the URL and dumbwaiter lets through (its other
#: connection arguments either clash with the broker's own, such as
#: ``decode_responses``, or cannot be written in a URL)
OPTIONS = urlopts.Table(
    "redis",
    [
        PREFIX,
        RETENTION,
        RECONNECT,
        WAIT_REPLICAS,
        WAIT_TIMEOUT,
        SOCKET_TIMEOUT,
        CONNECT_TIMEOUT,
        urlopts.integer("db", 0, "database number (or the path: /N)", passthrough=True),
        urlopts.text("username", None, "ACL user (or user@ in the URL)", passthrough=True),
        urlopts.text("password", None, "password (or :password@ in the URL)", passthrough=True),
        urlopts.text("client_name", None, "CLIENT SETNAME of each connection", passthrough=True),
        urlopts.integer(
            "health_check_interval", 0, "seconds idle before a PING check", passthrough=True
        ),
        urlopts.choice(
            "ssl_cert_reqs",
            "required",
            ("none", "optional", "required"),
            "server certificate check",
            passthrough=True,
            schemes=_TLS,
        ),
        *(
            urlopts.text(name, None, help, passthrough=True, schemes=_TLS)
            for name, help in (
                ("ssl_ca_certs", "CA bundle file"),
                ("ssl_ca_path", "directory of CA certificates"),
                ("ssl_ca_data", "CA certificates, PEM"),
                ("ssl_certfile", "client certificate file"),
                ("ssl_keyfile", "client key file"),
                ("ssl_password", "password of the client key"),
                ("ssl_ciphers", "OpenSSL cipher list"),
            )
        ),
        urlopts.flag(
            "ssl_check_hostname",
            True,
            "check the certificate's host name",
            passthrough=True,
            schemes=_TLS,
        ),
    ],
    client="redis-py",
)


def parse_url(url: str) -> tuple[str, urlopts.Values]:
    """Check the URL; split off dumbwaiter's own options (the rest is redis-py's)."""
    parts = urlsplit(url)
    if parts.scheme not in ("redis", "rediss"):
        raise InvalidURL(f"not a redis URL: {mask_url(url)!r}")
    opts = OPTIONS.parse(url)
    db = parts.path.strip("/")
    if db and not db.isdigit():
        raise InvalidURL(
            f"redis URL {mask_url(url)!r}: the path names the database, a number "
            f"(redis://host:6379/0), not {db!r}"
        )
    rest = urlunsplit(parts._replace(query=urlencode(opts.client)))
    return rest, opts


class RedisBroker(RedisCapacity, Transport, Admin, Coordination):
    capabilities: ClassVar[Capabilities] = Capabilities(
        sync_enqueue=True,
        multi_process=True,
        multi_host=True,
        limits=True,
        events=True,
        native_capacity=True,
    )
    schemes: ClassVar[tuple[str, ...]] = ("redis", "rediss")
    client_errors: ClassVar[tuple[type[BaseException], ...]] = (RedisError, OSError)

    def __init__(self, url: str) -> None:
        super().__init__(url)
        rest, opts = parse_url(url)
        self.retention = opts[RETENTION]
        try:
            target = Target(rest, opts[SOCKET_TIMEOUT], opts[CONNECT_TIMEOUT])
        except ValueError as exc:  # redis-py's own reading of the URL
            raise InvalidURL(f"redis URL {mask_url(url)!r}: {exc}") from None
        self.conn = Connection(
            url,
            target,
            opts[PREFIX] or "default",
            reconnect=opts[RECONNECT],
            wait_replicas=opts[WAIT_REPLICAS],
            wait_timeout=opts[WAIT_TIMEOUT],
        )
        self.lua = self.conn.lua
        #: the hash tag every key of this app starts with
        self.prefix = self.conn.keys.tag

    def __repr__(self) -> str:
        return f"<RedisBroker {self.prefix}>"

    def failure(
        self, exc: BaseException, what: str = "", waited: float | None = None
    ) -> BrokerError:
        return self.conn.failure(exc, what, waited)

    async def server_time(self) -> float | None:
        return await self.conn.server_time()
