"""What a ``postgresql://`` URL may say: the options, checked before libpq sees them."""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import urlencode, urlsplit

import psycopg
from psycopg import pq
from psycopg.conninfo import conninfo_to_dict

from ...errors import InvalidURL
from ...redact import mask_url
from .. import urlopts


@dataclass(frozen=True, slots=True)
class Options:
    """What a ``postgresql://`` URL says beyond where the server is."""

    conninfo: str
    schema: str = "public"
    #: connections the sync producers' pool keeps open (and opens at start)
    pool_min: int = 1
    #: most connections per event loop
    pool_max: int = 10
    #: most connections of the sync producer pool
    sync_pool_max: int = 10
    #: "auto": apply pending migrations on connect (development, tests)
    migrate: str = "check"
    #: seconds a finished job (succeeded or cancelled) is kept
    retention: float = 3600.0
    #: seconds between prunes by the maintenance leader
    prune_interval: float = 10.0
    #: statements are prepared on the server after this many runs (None: never;
    #: PgBouncer before 1.21 in transaction mode needs never)
    prepare_threshold: int | None = 5
    #: seconds between polls of an idle fetch while LISTEN is down
    poll_interval: float = 0.5
    #: synchronous_commit of a worker's own transitions (claims, outcomes,
    #: heartbeats): "off" trades a rerun after a server crash for a disk flush
    #: per batch; "on" (or "local", "remote_apply"...) flushes each
    worker_sync_commit: str = "off"
    #: seconds an enqueue keeps retrying while the server is unreachable, when
    #: no producer call's deadline (``App(enqueue_timeout=)``) says otherwise
    reconnect: float = 15.0


def _prepare(text: str) -> int | None:
    if text.lower() in ("", "none", "off"):
        return None
    value = int(text)
    if value < 0:
        raise ValueError(text)
    return value


def _libpq_keys() -> frozenset[str]:
    """Every connection parameter this libpq knows (``sslmode``, ``options``...)."""
    return frozenset(o.keyword.decode() for o in pq.Conninfo.get_defaults())


SCHEMA = urlopts.text(
    "schema",
    "public",
    "the schema holding dumbwaiter's tables",
    pattern=r".{1,50}",
    accepts="a schema name of 1 to 50 characters",
)
MIGRATE = urlopts.choice("migrate", "check", ("check", "auto"), "apply pending migrations?")
RETENTION = urlopts.seconds("retention", 3600.0, "seconds a finished job is kept")
PRUNE_INTERVAL = urlopts.seconds("prune_interval", 10.0, "seconds between prunes", positive=True)
POOL_MAX = urlopts.integer("pool_max", 10, "most connections per event loop and pool", low=2)
POOL_MIN = urlopts.integer("pool_min", 1, "connections the sync pool keeps open")
SYNC_POOL_MAX = urlopts.integer("sync_pool_max", 10, "most connections of the sync pool", low=1)
PREPARE_THRESHOLD: urlopts.Option[int | None] = urlopts.custom(
    "prepare_threshold",
    5,
    "runs before a statement is prepared on the server",
    _prepare,
    "a whole number of 0 or more, or none",
)
POLL_INTERVAL = urlopts.seconds(
    "poll_interval", 0.5, "seconds between polls while LISTEN is down", positive=True
)
WORKER_SYNC_COMMIT = urlopts.choice(
    "worker_sync_commit",
    "off",
    ("off", "local", "remote_write", "on", "remote_apply"),
    "synchronous_commit of a worker's own transitions",
)
RECONNECT = urlopts.seconds(
    "reconnect", 15.0, "seconds an enqueue keeps retrying while the server is unreachable"
)
#: ours, then the libpq parameters checked here before libpq sees them (any
#: other libpq parameter passes unchecked: libpq's parser knows them)
OPTIONS = urlopts.Table(
    "PostgreSQL",
    [
        SCHEMA,
        MIGRATE,
        RETENTION,
        PRUNE_INTERVAL,
        POOL_MAX,
        POOL_MIN,
        SYNC_POOL_MAX,
        PREPARE_THRESHOLD,
        POLL_INTERVAL,
        WORKER_SYNC_COMMIT,
        RECONNECT,
        urlopts.text(
            "application_name", "dumbwaiter", "name in pg_stat_activity", passthrough=True
        ),
        urlopts.choice(
            "sslmode",
            "prefer",
            ("disable", "allow", "prefer", "require", "verify-ca", "verify-full"),
            "TLS to the server",
            passthrough=True,
        ),
        urlopts.integer("connect_timeout", 0, "seconds to connect (0: no limit)", passthrough=True),
    ],
    client="libpq",
    other_keys=_libpq_keys,
    others="any other libpq connection parameter (target_session_attrs, sslrootcert...)",
    host_required=False,  # no host: libpq's Unix socket
    several=True,
)


def parse_url(url: str) -> Options:
    parts = urlsplit(url)
    if parts.scheme not in ("postgresql", "postgres"):
        raise InvalidURL(f"not a PostgreSQL URL: {mask_url(url)!r}")
    ours = OPTIONS.parse(url)
    rest = list(ours.client)
    if "application_name" not in ours.given:
        rest.append(("application_name", "dumbwaiter"))
    # written out, not with urlunsplit, which drops the "//" of a URL without
    # a host (``postgresql:///db``: libpq's Unix socket)
    conninfo = f"postgresql://{parts.netloc}{parts.path}?{urlencode(rest)}"
    try:  # libpq's own parser: the URI's syntax, and the keys only it knows
        conninfo_to_dict(conninfo)
    except psycopg.ProgrammingError as exc:
        raise InvalidURL(f"PostgreSQL URL {mask_url(url)!r}: {str(exc).strip()}") from None
    opts = Options(
        conninfo=conninfo,
        schema=ours[SCHEMA],
        pool_min=ours[POOL_MIN],
        pool_max=ours[POOL_MAX],
        sync_pool_max=ours[SYNC_POOL_MAX],
        migrate=ours[MIGRATE],
        retention=ours[RETENTION],
        prune_interval=ours[PRUNE_INTERVAL],
        prepare_threshold=ours[PREPARE_THRESHOLD],
        poll_interval=ours[POLL_INTERVAL],
        worker_sync_commit=ours[WORKER_SYNC_COMMIT],
        reconnect=ours[RECONNECT],
    )
    if opts.pool_min > opts.sync_pool_max:
        raise InvalidURL(
            f"PostgreSQL URL {mask_url(url)!r}: pool_min ({opts.pool_min}) is more than "
            f"sync_pool_max ({opts.sync_pool_max})"
        )
    return opts
