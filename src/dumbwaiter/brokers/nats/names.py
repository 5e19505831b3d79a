"""URL options, stream and subject names of one app namespace.

Everything of a namespace ``NS`` (``?prefix=NS``, default ``dumbwaiter``)
lives in five streams whose subjects start with ``dw.NS.`` and one KV bucket
``dw_NS`` (stream ``KV_dw_NS``, subjects ``$KV.dw_NS.>``):

=================  ==========================  ======================================
stream             subjects                    what
=================  ==========================  ======================================
``DW_NS_WORK``     ``dw.NS.w.QUEUE.PRIO``      job pointers (work-queue retention:
                   ``dw.NS.d.QUEUE.KIND``      gone once acked), delayed entries
                   ``dw.NS.t.MINUTE``          (eta, retries) and kv expiry marks
``DW_NS_JOBS``     ``dw.NS.j.e.ID``            the job index: a waiting job's envelope,
                   ``dw.NS.j.s.ID``            state record from the first transition,
                   ``dw.NS.j.k.HASH``          unique keys; one message per subject,
                                               ``max_age`` = retention
``DW_NS_DLQ``      ``dw.NS.x.QUEUE``           dead letters with every error
``DW_NS_HOLD``     ``dw.NS.h.HOLDER``          each process' running jobs and finish
                                               counts (leases, stats)
``DW_NS_EVENTS``   ``dw.NS.e.DOMAIN.ACTION``   the event log (``event_retention``)
``KV_dw_NS``       ``$KV.dw_NS.k.KEY...``      the kv store, locks, limits, config
                   ``$KV.dw_NS.c....``         (a KV bucket, history 1)
=================  ==========================  ======================================

docs/nats.md explains each.  Queue names, kv keys and event types become
subject tokens through ``tok`` (letters, digits, ``_`` and ``-`` stay; every
other byte is written ``=HH``), so any string is a valid, reversible token.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, urlsplit

from ...errors import InvalidURL
from ...redact import mask_url
from .. import urlopts

_NS = re.compile(r"^[A-Za-z0-9_-]{1,48}$")
_SAFE = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-")
_NS_PER_S = 1_000_000_000

PREFIX = urlopts.text(
    "prefix",
    "dumbwaiter",
    "namespace: stream and subject names (or the path)",
    pattern=r"[A-Za-z0-9_-]{0,48}",  # empty: the path's, else the default
    accepts="a namespace of 1-48 letters, digits, '_' or '-'",
)
RETENTION = urlopts.seconds(
    "retention", 3600.0, "seconds finished jobs stay visible", positive=True
)
DEAD_RETENTION = urlopts.seconds(
    "dead_retention", 0.0, "seconds dead letters are kept (0: until purged)"
)
ACK_WAIT = urlopts.seconds("ack_wait", 30.0, "AckWait of the work consumers", positive=True)
DUPE_WINDOW = urlopts.seconds(
    "dupe_window", 120.0, "Nats-Msg-Id de-duplication window", positive=True
)
STORAGE = urlopts.choice("storage", "file", ("file", "memory"), "stream storage")
REPLICAS = urlopts.integer("replicas", 1, "stream replicas in a cluster", low=1, high=5)
RECONNECT = urlopts.seconds(
    "reconnect", 30.0, "seconds an enqueue keeps retrying while NATS is unreachable"
)
TIMEOUT = urlopts.seconds("timeout", 10.0, "seconds a request waits for its reply", positive=True)
CONNECT_TIMEOUT = urlopts.seconds("connect_timeout", 5.0, "seconds to connect", positive=True)
NAME = urlopts.text("name", "dumbwaiter", "client connection name shown by the server")
TLS = urlopts.flag("tls", False, "connect with TLS (system CA bundle)")
TOKEN = urlopts.text("token", None, "auth token")
#: every option of a nats:// URL (all are dumbwaiter's: it builds nats-py's
#: connect arguments itself)
OPTIONS = urlopts.Table(
    "nats",
    [
        PREFIX,
        RETENTION,
        DEAD_RETENTION,
        ACK_WAIT,
        DUPE_WINDOW,
        STORAGE,
        REPLICAS,
        RECONNECT,
        TIMEOUT,
        CONNECT_TIMEOUT,
        NAME,
        TLS,
        TOKEN,
    ],
    several=True,
)


@dataclass(frozen=True, slots=True)
class Settings:
    servers: list[str]
    ns: str
    retention: float = 3600.0
    dead_retention: float = 0.0
    ack_wait: float = 30.0
    dupe_window: float = 120.0
    storage: str = "file"
    replicas: int = 1
    reconnect: float = 30.0
    timeout: float = 10.0
    connect_timeout: float = 5.0
    name: str = "dumbwaiter"
    tls: bool = False
    token: str | None = None
    user: str | None = None
    password: str | None = None


def parse_url(url: str) -> Settings:
    """``nats://[user:pass@]host[:port][,host2[:port2]...][/NS][?options]``."""
    parts = urlsplit(url)
    if parts.scheme != "nats":
        raise InvalidURL(f"not a nats URL: {mask_url(url)!r}")
    opts = OPTIONS.parse(url)
    netloc = parts.netloc
    user = password = None
    if "@" in netloc:
        cred, netloc = netloc.rsplit("@", 1)
        user, _, password = cred.partition(":")
        user, password = unquote(user), unquote(password) if password else None
    hosts = netloc.split(",")
    servers = [f"nats://{h}" if ":" in h.rsplit("]", 1)[-1] else f"nats://{h}:4222" for h in hosts]
    given = opts[PREFIX] if PREFIX.name in opts.given else ""
    ns = given or parts.path.strip("/") or PREFIX.default
    if not _NS.match(ns):
        raise InvalidURL(
            f"nats URL {mask_url(url)!r}: namespace {ns!r} must be 1-48 letters, digits, '_' or '-'"
        )
    return Settings(
        servers=servers,
        ns=ns,
        retention=opts[RETENTION],
        dead_retention=opts[DEAD_RETENTION],
        ack_wait=opts[ACK_WAIT],
        dupe_window=opts[DUPE_WINDOW],
        storage=opts[STORAGE],
        replicas=opts[REPLICAS],
        reconnect=opts[RECONNECT],
        timeout=opts[TIMEOUT],
        connect_timeout=opts[CONNECT_TIMEOUT],
        name=opts[NAME],
        tls=opts[TLS],
        token=opts[TOKEN],
        user=user,
        password=password,
    )


def tok(text: str) -> bytes:
    """``text`` as one subject token (reversible, see the module doc)."""
    raw = text.encode()
    if raw and all(b in _SAFE for b in raw):
        return raw
    if not raw:
        return b"="
    return b"".join(bytes((b,)) if b in _SAFE else b"=%02X" % b for b in raw)


def untok(token: bytes) -> str:
    if token == b"=":
        return ""
    if b"=" not in token:
        return token.decode()
    out = bytearray()
    i = 0
    while i < len(token):
        if token[i] == 61:  # "="
            out.append(int(token[i + 1 : i + 3], 16))
            i += 3
        else:
            out.append(token[i])
            i += 1
    return out.decode()


def key_tokens(key: str) -> bytes:
    """A kv key as subject tokens, split at ``:`` so prefix scans can filter."""
    return b".".join(tok(part) for part in key.split(":"))


def key_of(tokens: bytes) -> str:
    return ":".join(untok(t) for t in tokens.split(b"."))


def prio_tok(priority: int) -> bytes:
    return b"p%d" % priority if priority >= 0 else b"n%d" % -priority


def prio_of(token: bytes) -> int:
    return int(token[1:]) if token[:1] == b"p" else -int(token[1:])


def digest(text: str) -> str:
    return hashlib.blake2b(text.encode(), digest_size=8).hexdigest()


def stream_names(ns: str) -> tuple[str, ...]:
    """The streams of namespace ``ns``: deleting them deletes the namespace."""
    return (*(f"DW_{ns}_{s}" for s in ("WORK", "JOBS", "DLQ", "HOLD", "EVENTS")), f"KV_dw_{ns}")


class Subjects:
    """Stream names, subjects and consumer names of one namespace."""

    def __init__(self, s: Settings) -> None:
        ns = s.ns
        self.ns = ns
        self.work = f"DW_{ns}_WORK"
        self.jobs = f"DW_{ns}_JOBS"
        self.dlq = f"DW_{ns}_DLQ"
        self.hold = f"DW_{ns}_HOLD"
        self.events = f"DW_{ns}_EVENTS"
        #: the coordination store is a JetStream KV bucket (``nats kv ls``)
        self.bucket = f"dw_{ns}"
        self.kv = f"KV_{self.bucket}"
        self.streams = stream_names(ns)
        b = b"dw." + ns.encode() + b"."
        self.base = b
        self.w = b + b"w."
        self.d = b + b"d."
        self.t = b + b"t."
        self.je = b + b"j.e."
        self.js = b + b"j.s."
        self.jk = b + b"j.k."
        self.x = b + b"x."
        self.h = b + b"h."
        self.e = b + b"e."
        kv = b"$KV." + self.bucket.encode() + b"."
        self.k = kv + b"k."
        self.c = kv + b"c."
        self.delay_consumer = "delay"
        self._direct = {
            name: b"$JS.API.DIRECT.GET." + name.encode() + b"." for name in self.streams
        }

    def direct(self, stream: str, subject: bytes) -> bytes:
        """Subject of a direct get of the last message on ``subject``."""
        return self._direct[stream] + subject

    def pointer(self, queue: str, priority: int) -> bytes:
        return self.w + tok(queue) + b"." + prio_tok(priority)

    def delayed(self, queue: str, kind: bytes) -> bytes:
        return self.d + tok(queue) + b"." + kind

    def dead(self, queue: str) -> bytes:
        return self.x + tok(queue)

    def consumer(self, queue: str, priority: int) -> str:
        """Durable work consumer of one queue and priority level."""
        return f"w_{digest(queue)}_{prio_tok(priority).decode()}"

    def event_subject(self, event_type: str) -> bytes:
        return self.e + b".".join(tok(part) for part in event_type.split("."))

    def unique(self, key: str) -> bytes:
        return self.jk + digest(key).encode() + digest(key[::-1]).encode()

    def stream_configs(self, s: Settings, event_retention: float) -> list[dict[str, Any]]:
        """The six streams' JetStream configurations (see the module doc)."""
        common: dict[str, Any] = {
            "storage": s.storage,
            "num_replicas": s.replicas,
            "discard": "old",
            "allow_direct": True,
        }
        ns_ = self.base.decode()
        retention_ns = int(s.retention * _NS_PER_S)
        dupe_ns = int(s.dupe_window * _NS_PER_S)
        event_ns = int(event_retention * _NS_PER_S)

        def window(max_age: int) -> int:
            return dupe_ns if not max_age else min(dupe_ns, max_age)

        return [
            {
                **common,
                "name": self.work,
                "subjects": [ns_ + "w.>", ns_ + "d.>", ns_ + "t.>"],
                "retention": "workqueue",
                "duplicate_window": dupe_ns,
            },
            {
                **common,
                "name": self.jobs,
                "subjects": [ns_ + "j.>"],
                "retention": "limits",
                "max_age": retention_ns,
                "max_msgs_per_subject": 1,
                "duplicate_window": window(retention_ns),
            },
            {
                **common,
                "name": self.dlq,
                "subjects": [ns_ + "x.>"],
                "retention": "limits",
                "max_age": int(s.dead_retention * _NS_PER_S),
                "duplicate_window": window(int(s.dead_retention * _NS_PER_S)),
            },
            {
                **common,
                "name": self.hold,
                "subjects": [ns_ + "h.>"],
                "retention": "limits",
                "max_age": retention_ns,
                "max_msgs_per_subject": 1,
                "duplicate_window": window(retention_ns),
            },
            {
                **common,
                "name": self.events,
                "subjects": [ns_ + "e.>"],
                "retention": "limits",
                "max_age": event_ns,
                "duplicate_window": window(event_ns),
            },
            {
                # a KV bucket (history 1), so ``nats kv`` and nats-py's
                # ``js.key_value("dw_NS")`` see it; dumbwaiter deletes expired
                # entries by sequence, so deletes are allowed
                **common,
                "name": self.kv,
                "subjects": [f"$KV.{self.bucket}.>"],
                "retention": "limits",
                "max_msgs_per_subject": 1,
                "allow_rollup_hdrs": True,
                "deny_delete": False,
            },
        ]
