"""``amqp://USER:PASS@HOST:PORT/VHOST?state=URL&prefix=NAME`` (``amqps://`` for TLS).

RabbitMQ carries the jobs: quorum queues, publisher confirms (an enqueue
returns once RabbitMQ confirmed every message), manual acks after the
outcome is recorded, consumers whose prefetch follows the worker's drain
rate (``_prefetch_for``), a topic exchange that fans events out to group
queues, a dead-letter exchange into a DLQ per queue, and a plugin-free delay
cascade (``topology.py``) for ``eta`` and retries.

RabbitMQ has no key-value store, no locks and no index of jobs, so a
companion *state store* (any other dumbwaiter broker, named by ``state=``)
keeps them: coordination (locks, kv, rate limits, slots) is delegated to it
as is, and every job has a record there (``ledger.py``) that the admin API
reads and that decides whether a copy RabbitMQ hands out is current.

Leases: a fetched job's message stays unacked on this connection until its
outcome is recorded, so a crashed worker's jobs are redelivered by RabbitMQ
as soon as its connection drops.  The lease itself (a hung worker, heartbeats,
fencing) lives in the record: ``rescue`` sends a new copy of a job whose
lease ran out and bumps its version, so the hung worker's copy is stale and
its late ack counts for nothing.  A redelivered copy whose record is still
leased to a live worker is parked in the delay cascade until that lease ends
(RabbitMQ keeps custody of it; the ledger decides when it runs).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import math
import os
import re
import secrets
import time
import weakref
from collections import deque
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, ClassVar, TypeVar
from urllib.parse import quote, unquote, urlencode, urlsplit, urlunsplit

import orjson
from pamqp import commands as spec

from ...errors import (
    BrokerConfigError,
    BrokerError,
    InvalidURL,
    LeaseExpired,
    MessageDecodeError,
    StateStoreConflict,
)
from ...message import (
    EVENT,
    TASK,
    ErrorRecord,
    Message,
    decode,
    encode,
    encode_checked,
    uuid7,
)
from ...redact import mask_url
from ...state import CANCELLABLE_STATES, FINAL_STATES, State
from .. import from_url, identity, urlopts
from ..base import (
    FOUND_DEAD_LIMIT,
    Binding,
    Broker,
    Capabilities,
    DeadLetter,
    Delivery,
    JobFilter,
    JobInfo,
    KvWrite,
    Page,
    QueueStats,
    Rescued,
    StateDelegation,
    delivery_of,
    events_page,
    kv_write,
    stats_rows,
)
from ..clock import ServerClock
from ..deadline import Backoff
from ..gate import Gate
from . import announce
from . import topology as topo
from .ledger import Keys, Record, delivery_id
from .link import AMQP_ERRORS, CLOSE_TIMEOUT, Link, Raw, failure_of

log = logging.getLogger("dumbwaiter.rabbitmq")

#: finished jobs' records are kept this long (seconds) unless a result is kept longer
DEFAULT_RETENTION = 3600.0
#: the file of the state store when the URL names none (one machine only):
#: under the user's state directory (``identity.state_dir``), named after
#: the broker's host, port, vhost and prefix (``default_state_url``)
DEFAULT_STATE_NAME = "rabbitmq-{host}-{port}-{vhost}-{prefix}"
#: the default of versions before it, relative to the working directory
OLD_DEFAULT_STATE = "dumbwaiter-state.db"
_EXCHANGE_TYPES = ("topic", "direct", "headers", "fanout")
#: header "unique" -> the states in which a key's holder blocks a new job with that key
#: seconds of lease left under which an outcome reads the record (fencing)
SURE = 1.0
#: seconds a copy newer than its record waits for the record to be written
RECORD_GRACE = 5.0
#: seconds between reconciles of the records with the lanes (``_reconcile``):
#: each process tries once per period, and one process of the app does it
RECONCILE_EVERY = 60.0
#: seconds a job must have been due, beyond its producer's ``reconnect``
#: window, before a reconcile may send its copy again
STRANDED_AFTER = 30.0
#: most copies one reconcile sends (the longest waiting first)
RECONCILE_MAX = 1000
#: what a waiting record holds, as ``Record.dump`` writes it: a reconcile
#: parses only records that contain one
_WAITING_MARKS = (b'"s":"ready"', b'"s":"scheduled"')
#: seconds of that a first-seen copy waits in the worker, judged again after
#: 0.25, 0.5, 1, 2... ms, before it goes to the delay cascade (UNIT and
#: more): a producer writes a job's record while RabbitMQ stores its copy,
#: and a worker may see the copy a moment before the record's commit; the
#: first recheck is of the order of a record write (~0.2-0.3 ms on SQLite)
LOCAL_GRACE = 0.05
FIRST_RECHECK = 0.00025
#: seconds of a worker's drain that its consumers' prefetch may hold beyond
#: its slots (``_prefetch_for``), and the most it holds in all
PREFETCH_HORIZON = 0.05
PREFETCH_MAX = 1000
#: seconds over which that drain rate is measured
PREFETCH_WINDOW = 0.1
#: turns of the event loop an ack waits for this loop's next admission to
#: carry its records (``_ride``); then it writes them alone
RIDE_TURNS = 6
#: what a publish that may be tried again on a new connection can raise
SEND_ERRORS: tuple[type[BaseException], ...] = (BrokerError, *AMQP_ERRORS)
#: what ``_judge`` decides about a copy RabbitMQ handed out
_TAKE, _DROP, _PARK, _DEAD = "take", "drop", "park", "dead"
#: and what the admission decides before: its queue is paused; a fanned-out
#: event without a record, whose group's binding must be read first
_REQUEUE, _BIND = "requeue", "bind"
#: no record yet for a first-seen copy: judged again in a moment (``LOCAL_GRACE``)
_WAIT = "wait"
#: ``_key_holder``: the key changed hands between its read and its update
_AGAIN = "again"
#: rounds of that before an enqueue gives up (each is another producer's win)
KEY_ROUNDS = 20
_Taken = tuple[dict[str, bytes], str | None]
_Verdict = tuple[str, "Record | None"]
T = TypeVar("T")
_UNIQUE_BLOCKS = {
    "active": frozenset({State.SCHEDULED, State.READY, State.RETRYING, State.RUNNING}),
    "queued": frozenset({State.SCHEDULED, State.READY, State.RETRYING}),
}


@dataclass(frozen=True, slots=True)
class Token:
    """A delivery's fencing token (the record's) and its AMQP message."""

    record: int
    gen: int
    tag: int


@dataclass(slots=True)
class _Ride:
    """An ack's records (with their ttls), waiting for an admission to
    write them in its ``kv_update``."""

    writes: dict[str, KvWrite]
    ids: set[str]
    done: asyncio.Future[None]
    taken: bool = False


def _seen(raw: Raw, now: float) -> float:
    """When a parked copy was first seen (``dw-seen``, a decimal string; a
    float from an older version, 32 bits wide, is read as it is), or ``now``."""
    value = raw.headers.get("dw-seen")
    if isinstance(value, bytes):
        value = value.decode(errors="replace")
    try:
        return now if value is None else float(value)
    except (TypeError, ValueError):
        return now


def _wait(link: Link, raw: Raw, now: float) -> None:
    """Keep a copy without its record in ``link.waiting`` (unacked) to be
    judged again after 1, 2, 4... ms."""
    if raw.waited_since == 0.0:
        raw.waited_since, raw.recheck_at = now, now + FIRST_RECHECK
    else:
        raw.recheck_at = now + max(FIRST_RECHECK, now - raw.waited_since)
    link.waiting.append(raw)


def _recheck_due(link: Link, now: float) -> None:
    """Put the waiting copies whose time to be judged again has come back at
    the head of the buffer (``now`` on the broker's clock)."""
    if not link.waiting:
        return
    due = [r for r in link.waiting if r.recheck_at <= now]
    if due:
        link.waiting = [r for r in link.waiting if r.recheck_at > now]
        link.buffer.extendleft(reversed(due))


def _enq_of(raw: Raw) -> str | None:
    """The token of the enqueue that sent a copy (``dw-e``), if it carries one."""
    return _text_header(raw, "dw-e")


def _text_header(raw: Raw, name: str) -> str | None:
    """A header of text, whichever AMQP string type carried it; None when it
    is absent or of another type (a message put on the queue by hand)."""
    value = raw.headers.get(name)
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    return value if isinstance(value, str) else None


def _ver_of(raw: Raw) -> int:
    """A copy's version (``dw-v``); 0 when it carries none, or one that is not
    a number (a message put on the queue by hand must not fail the fetch)."""
    value = raw.headers.get("dw-v", 0)
    try:
        return int(value)
    except (TypeError, ValueError):
        return 0


def _other_enqueue(copy: str | None, record: str | None) -> bool:
    """Whether a copy is another enqueue's than its record's: only when both
    carry an enqueue token and they differ.  A copy without one was sent by
    a rescue, a retry, an admin call or a version before the tokens; a
    record without one was written (or rewritten, by a lease or an outcome)
    by such a version: a worker of it drops the field.  Either way the
    version alone judges the copy, as before the tokens: during a rolling
    upgrade, the original copy of a job an older worker leased and lost
    must still run, and a losing duplicate of an id whose record has no
    token may run with its own arguments, as it did then."""
    return copy is not None and record is not None and copy != record


def _may_wait(raw: Raw, now: float) -> bool:
    """Whether a copy without its record may wait in the worker (``_WAIT``)
    rather than in the cascade: one a consumer handed over, never parked
    before, within ``LOCAL_GRACE`` of its first wait."""
    return (
        raw.can_wait
        and "dw-seen" not in raw.headers
        and (raw.waited_since == 0.0 or now - raw.waited_since < LOCAL_GRACE)
    )


_TLS = ("amqps",)
STATE = urlopts.text(
    "state",
    None,
    "URL of the state store (URL-encoded); default: a SQLite file of this machine, "
    "~/.local/state/dumbwaiter/rabbitmq-HOST-PORT-VHOST-PREFIX-*.db",
)
PREFIX = urlopts.text("prefix", "dw", "first word of every queue, exchange and record name")
QUEUE_TYPE = urlopts.choice("queue_type", "quorum", ("quorum", "classic"), "type of every queue")
DELAYS = urlopts.text("delays", "dw.delay", "name of the delay cascade")
EXCHANGE_TYPE = urlopts.choice(
    "exchange_type", "topic", _EXCHANGE_TYPES, "type of the events exchange"
)
RETENTION = urlopts.seconds("retention", DEFAULT_RETENTION, "seconds finished jobs' records stay")
RECONNECT = urlopts.seconds(
    "reconnect", 30.0, "seconds an enqueue keeps trying while RabbitMQ is unreachable"
)
PREFETCH = urlopts.integer("prefetch", 0, "consumer prefetch (0: follows the drain rate)")
#: ours, then what aiormq reads from the URL's query (it ignores any other key)
OPTIONS = urlopts.Table(
    "amqp",
    [
        STATE,
        PREFIX,
        QUEUE_TYPE,
        DELAYS,
        EXCHANGE_TYPE,
        RETENTION,
        RECONNECT,
        PREFETCH,
        urlopts.integer(
            "heartbeat", 60, "seconds between heartbeats (0: none)", high=65535, passthrough=True
        ),
        urlopts.choice("auth", "plain", ("plain", "external"), "SASL mechanism", passthrough=True),
        *(
            urlopts.text(name, None, help, passthrough=True, schemes=_TLS)
            for name, help in (
                ("cafile", "CA bundle file"),
                ("capath", "directory of CA certificates"),
                ("cadata", "CA certificates, base64"),
                ("certfile", "client certificate file"),
                ("keyfile", "client key file"),
            )
        ),
        urlopts.flag(
            "no_verify_ssl",
            False,
            "skip the server certificate check",
            passthrough=True,
            schemes=_TLS,
        ),
    ],
    client="aiormq",
)


def default_state_url(amqp_url: str, prefix: str) -> str:
    """The state store of a URL that names none: a SQLite file under the
    user's state directory, one per broker namespace (host, port, vhost,
    prefix), so every process of this machine finds the same one whatever
    its working directory.  Other machines have files of their own: the
    announcement (``announce.py``) refuses the second one."""
    parts = urlsplit(amqp_url)
    port = parts.port or (5671 if parts.scheme == "amqps" else 5672)
    vhost = unquote(parts.path[1:]) if len(parts.path) > 1 else "/"
    label = DEFAULT_STATE_NAME.format(
        host=(parts.hostname or "localhost").lower(), port=port, vhost=vhost, prefix=prefix
    )
    digest = hashlib.sha256(label.encode()).hexdigest()[:8]
    slug = re.sub(r"[^A-Za-z0-9._-]+", "_", label)[:100]
    return f"sqlite:///{identity.state_dir() / f'{slug}-{digest}.db'}"


def _make_state_dir(path: Path, state_url: str) -> None:
    """Make the default state store's directory (private to the user), and
    say so when the old default file sits in the working directory: its
    records are not read any more."""
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    if os.path.exists(OLD_DEFAULT_STATE):
        log.warning(
            "%s is the default state store of earlier versions; the default is now %s "
            "(the same from every working directory): move the file there, with every "
            "process stopped, to keep its records",
            os.path.abspath(OLD_DEFAULT_STATE),
            mask_url(state_url),
        )


def parse_url(url: str) -> tuple[str, urlopts.Values]:
    """Check the URL; split off dumbwaiter's options (the rest is aiormq's)."""
    parts = urlsplit(url)
    if parts.scheme not in ("amqp", "amqps"):
        raise InvalidURL(f"not an AMQP URL: {mask_url(url)!r}")
    opts = OPTIONS.parse(url)
    path = parts.path or "/"
    rest = urlunsplit(parts._replace(path=path, query=urlencode(opts.client)))
    return rest, opts


class RabbitMQBroker(StateDelegation):
    capabilities: ClassVar[Capabilities] = Capabilities(
        sync_enqueue=False,
        events=True,
        limits=True,
        multi_process=True,
        max_message_size=128 * 1024 * 1024,
    )
    schemes: ClassVar[tuple[str, ...]] = ("amqp", "amqps")
    client_errors: ClassVar[tuple[type[BaseException], ...]] = AMQP_ERRORS

    def __init__(self, url: str) -> None:
        super().__init__(url)
        self.amqp_url, opts = parse_url(url)
        prefix = opts[PREFIX] or PREFIX.default
        self.retention = opts[RETENTION]
        #: seconds an enqueue keeps trying while RabbitMQ is unreachable
        self.reconnect = opts[RECONNECT]
        #: consumer prefetch (0: follows the worker's drain rate)
        self.prefetch = opts[PREFETCH]
        self.names = topo.Names(prefix, opts[DELAYS] or DELAYS.default, opts[QUEUE_TYPE])
        self.exchange_type = opts[EXCHANGE_TYPE]
        given = opts[STATE]
        #: the directory of the default state store, made on first use
        self._state_dir = None if given else identity.state_dir()
        #: absolute (a relative SQLite path is resolved now): every message names the file
        self.state_url = state_url = identity.absolute_url(
            given or default_state_url(self.amqp_url, prefix)
        )
        if urlsplit(state_url).scheme in ("amqp", "amqps"):
            raise InvalidURL("the state store of an amqp:// broker cannot be RabbitMQ itself")
        try:
            store = from_url(state_url)
        except InvalidURL as exc:
            raise InvalidURL(f"the state= of amqp URL {mask_url(url)!r}: {exc}") from None
        #: the companion broker that keeps records and coordination.  Until
        #: the vhost agreed that it is the app's store (``_claim``), ``state``
        #: is a gate in front of it that lets no call through before; then the
        #: store itself (no cost per call), and the gate again on a refusal.
        self._store = store
        #: the state store's clock, which every record's time is on
        self.clock = ServerClock()
        self._gate = Gate(store, self._admit_store)
        self.state: Broker = self._gate
        # Flow control and sharing between processes and hosts are what the
        # state store offers; the class default claims them, each instance
        # says its own.
        caps = replace(
            type(self).capabilities,
            limits=type(store).capabilities.limits,
            multi_process=type(store).capabilities.multi_process,
            multi_host=type(store).capabilities.multi_host,
        )
        setattr(self, "capabilities", caps)  # noqa: B010 (a per-instance ClassVar)
        #: this process's identity of the store (``_identity``)
        self._ident: identity.Identity | None = None
        #: link -> the connection generation whose claim passed
        self._claimed: weakref.WeakKeyDictionary[Link, int] = weakref.WeakKeyDictionary()
        self._claiming: weakref.WeakKeyDictionary[Link, asyncio.Lock] = weakref.WeakKeyDictionary()
        self.keys = Keys(prefix)
        self.instance = secrets.token_hex(6)
        self._links: dict[asyncio.AbstractEventLoop, Link] = {}
        #: jobs this broker object leased: id -> (token, lease_until)
        self._held: dict[str, tuple[int, float]] = {}
        #: the records of those jobs as this broker last wrote them
        self._recs: dict[str, Record] = {}
        #: jobs a fetch dead-lettered (their worker died on the last attempt),
        #: for the next ``rescue`` to report
        self._found_dead: deque[DeadLetter] = deque(maxlen=FOUND_DEAD_LIMIT)
        self._declared: set[str] = set()
        self._cascade = False
        self._bindings: list[Binding] = []
        #: when this process may next try a reconcile (``time.monotonic()``)
        self._reconcile_at = 0.0

    def __repr__(self) -> str:
        return f"<RabbitMQBroker {self.names.prefix} state={self.state!r}>"

    # -- connections -------------------------------------------------------------

    def _link_for_loop(self) -> Link:
        loop = asyncio.get_running_loop()
        link = self._links.get(loop)
        if link is None:
            for old in [lp for lp in self._links if lp.is_closed()]:
                del self._links[old]
            name = f"dumbwaiter {self.names.prefix} {self.instance}"
            link = self._links[loop] = Link(self.amqp_url, name, loop)
        return link

    async def _link(self) -> Link:
        link = self._link_for_loop()
        await self._ensure(link)
        await self._now()
        return link

    async def _now(self) -> float:
        """The state store's time now (``clock.py``), read again when due."""
        if self.clock.due:
            await self.clock.try_sync(self._store_time)
        return self.clock.now()

    async def _store_time(self) -> float:
        """The state store's server clock: the records' lease ends and run
        times live there, written and compared by every host
        (``clock.py``); this host's for a store without one (SQLite)."""
        t = await self._store.server_time()
        return time.time() if t is None else t

    def failure(self, exc: BaseException, waited: float | None = None) -> BrokerError:
        """aiormq's (or a socket's) ``exc`` as the ``BrokerError`` it means
        (``link.failure_of``)."""
        return failure_of(self.amqp_url, exc, waited)

    async def _ensure(self, link: Link) -> None:
        """Connect ``link`` if need be; on each new connection, claim the
        vhost's word that our state store is the app's before anything is
        sent on it (``announce.py``)."""
        await link.ensure()
        if self._claimed.get(link) != link.gen:
            await self._claim(link)

    async def _claim(self, link: Link) -> None:
        lock = self._claiming.setdefault(link, asyncio.Lock())
        async with lock:
            gen = link.gen
            if self._claimed.get(link) == gen or link.conn is None:
                return
            ours = await self._identity()
            n = self.names
            try:
                await announce.claim(link.conn, n.prefix, n.queue_type, ours, self._where)
            except StateStoreConflict:
                self._gate.shut()  # the state store is not ours to use any more
                self.state = self._gate
                raise
            except AMQP_ERRORS as exc:
                raise await self._failed(link, "announce the state store", exc) from exc
            self._claimed[link] = gen
            self.state = self._store

    @property
    def _where(self) -> str:
        return f"the RabbitMQ app {mask_url(self.amqp_url)} prefix {self.names.prefix!r}"

    async def _identity(self) -> identity.Identity:
        """The state store's identity (its store id written on first use)."""
        if self._ident is None:
            if self._state_dir is not None:
                _make_state_dir(self._state_dir, self._store.url)
            self._ident = await identity.identity_of(self._store)
        return self._ident

    async def _admit_store(self) -> None:
        """The gate's check: the vhost agreed on this connection."""
        await self._link()

    async def forget_state_identity(self) -> bool:
        link = self._link_for_loop()
        await link.ensure()  # no claim: this process must not hold the announcement
        if link.conn is None:
            raise BrokerError("rabbitmq: the connection is closed")
        try:
            return await announce.forget(link.conn, self.names.prefix, self._where)
        except AMQP_ERRORS as exc:
            raise await self._failed(link, "forget the state store", exc) from exc

    async def _failed(
        self, link: Link, what: str, exc: BaseException, waited: float | None = None
    ) -> BrokerError:
        """A call failed on the connection: drop it (the next call reconnects)."""
        log.warning("rabbitmq %s failed: %r; reconnecting on the next call", what, exc)
        await link.drop()
        self._declared.clear()
        self._cascade = False
        return self.failure(exc, waited)

    async def open(self) -> None:
        await self.state.open()
        await self._link()

    async def close(self) -> None:
        """Close every loop's connection and wait until each has closed: a
        loop that stops right after (the portal's, a test's) must not hold
        aiormq's tasks still pending."""
        loop = asyncio.get_running_loop()
        links, self._links = self._links, {}
        others: list[asyncio.Future[None]] = []
        for lp, link in links.items():
            if lp is loop:
                await link.drop()
            elif lp.is_running() and not lp.is_closed():  # another loop's (the portal's)
                done = asyncio.run_coroutine_threadsafe(link.drop(), lp)
                others.append(asyncio.wrap_future(done))
        if others:
            # bounded: a loop blocked on this one (a sync call waiting for it)
            # would never run its drop
            _, late = await asyncio.wait(others, timeout=2 * CLOSE_TIMEOUT)
            for f in late:
                f.cancel()
        await self.state.close()

    # -- topology ------------------------------------------------------------------

    async def _declare_queue(self, link: Link, queue: str) -> None:
        """The main lane of ``queue`` (priority lanes: ``_declare_lane``; the
        DLQ: ``_declare_dlq``, when the first job dies)."""
        if queue in self._declared:
            return
        await self._ensure_cascade(link)
        await self._declare_lane(link, queue, topo.MAIN)
        await self.state.kv_set({self.keys.queue + queue: b"1"})
        self._declared.add(queue)

    async def _declare_dlq(self, link: Link, queue: str) -> None:
        """The dead-letter exchange and ``queue``'s DLQ.  Made on first use:
        every quorum queue holds file handles of the server's (a few hundred
        fit in RabbitMQ's default limit), and most queues never see a dead
        letter.  Nothing dead-letters natively before: dumbwaiter never
        rejects, and its lanes have no length or delivery limit."""
        name = self.names.dlq(queue)
        if name in self._declared:
            return
        ch = link.channel()
        await ch.exchange_declare(self.names.dlx, exchange_type="direct", durable=True)
        await ch.queue_declare(name, durable=True, arguments=self._queue_args())
        await ch.queue_bind(name, self.names.dlx, routing_key=queue)
        await self.state.kv_set({self.keys.dlq + queue: b"1"})
        self._declared.add(name)

    def _queue_args(self, dead_letter_to: str | None = None) -> dict[str, Any]:
        args: dict[str, Any] = {}
        if self.names.queue_type == "quorum":
            args["x-queue-type"] = "quorum"
        if dead_letter_to is not None:
            args["x-dead-letter-exchange"] = self.names.dlx
            args["x-dead-letter-routing-key"] = dead_letter_to
        return args

    async def _declare_lane(self, link: Link, queue: str, lane: str) -> None:
        """One lane of ``queue``, bound to the cascade's exit.  The priority
        lanes are made when the first job of that priority comes, and are
        recorded in the state store so that every fetcher reads them."""
        name = self.names.lane(queue, lane)
        if name in self._declared:
            return
        ch = link.channel()
        await ch.queue_declare(name, durable=True, arguments=self._queue_args(queue))
        await ch.queue_bind(name, self.names.level(-1), routing_key=topo.exit_pattern(name))
        if lane != topo.MAIN:
            await self.state.kv_set({f"{self.keys.lane}{queue}\x1f{lane}": b"1"})
        self._declared.add(name)

    async def _ensure_cascade(self, link: Link) -> None:
        """Declare the delay cascade (idempotent; shared by the vhost)."""
        if self._cascade:
            return
        ch = link.channel()
        n = self.names
        await ch.exchange_declare(n.level(-1), exchange_type="topic", durable=True)
        for lvl in range(topo.LEVELS):
            await ch.exchange_declare(n.level(lvl), exchange_type="topic", durable=True)
            await ch.queue_declare(
                n.level_queue(lvl),
                durable=True,
                arguments={
                    "x-queue-type": "quorum",
                    "x-message-ttl": round(topo.UNIT * 1000 * 2**lvl),
                    "x-dead-letter-exchange": n.level(lvl - 1),
                    "x-dead-letter-strategy": "at-least-once",
                    "x-overflow": "reject-publish",
                },
            )
            await ch.queue_bind(
                n.level_queue(lvl), n.level(lvl), routing_key=topo.level_pattern(lvl, "1")
            )
            await ch.exchange_bind(
                destination=n.level(lvl - 1),
                source=n.level(lvl),
                routing_key=topo.level_pattern(lvl, "0"),
            )
        self._cascade = True

    async def _events_exchange(self, link: Link, event_type: str = "") -> str:
        n = self.names
        name = n.events if self.exchange_type != "fanout" else f"{n.events}.{event_type}"
        if name not in self._declared:
            await link.channel().exchange_declare(
                name, exchange_type=self.exchange_type, durable=True
            )
            self._declared.add(name)
        return name

    async def declare(self, queues: Sequence[str], bindings: Sequence[Binding] = ()) -> None:
        link = await self._link()
        try:
            for q in {*queues, *(b.queue for b in bindings)}:
                await self._declare_queue(link, q)
            ch = link.channel()
            for b in bindings:
                exchange = await self._events_exchange(link, b.pattern)
                args: dict[str, Any] | None = None
                rk = b.pattern
                if self.exchange_type == "headers":
                    args, rk = {"x-match": "all", "dw-type": b.pattern}, ""
                elif self.exchange_type == "fanout":
                    rk = ""
                await ch.queue_bind(
                    self.names.lane(b.queue), exchange, routing_key=rk, arguments=args
                )
        except AMQP_ERRORS as exc:
            raise await self._failed(link, "declare", exc) from exc
        if bindings:
            await self.state.kv_set(
                {
                    f"{self.keys.binding}{b.queue}\x1f{b.pattern}": str(b.max_attempts).encode()
                    for b in bindings
                }
            )
            known = {(b.pattern, b.queue): b for b in self._bindings}
            known.update({(b.pattern, b.queue): b for b in bindings})
            self._bindings = list(known.values())

    async def _load_bindings(self) -> list[Binding]:
        found = await self.state.kv_scan(self.keys.binding)
        out = []
        for k, v in found.items():
            queue, pattern = k[len(self.keys.binding) :].split("\x1f", 1)
            out.append(Binding(pattern, queue, int(v)))
        self._bindings = out
        return out

    # -- copies ----------------------------------------------------------------------

    def _copy(
        self,
        msg: Message,
        ver: int,
        run_at: float,
        body: bytes | None = None,
        enq: str | None = None,
    ) -> tuple[str, str, bytes, spec.Basic.Properties]:
        """How to send one copy of a job: straight into its lane, or through the
        delay cascade when ``run_at`` is ahead.  ``enq``: the token of the
        enqueue that writes its record meanwhile (``dw-e``, see ``_judge``)."""
        lane = topo.lane_of(msg.priority)
        target = self.names.lane(msg.queue, lane)
        props = spec.Basic.Properties(
            content_type="application/json",
            delivery_mode=2,
            message_id=msg.id,
            headers={"dw-v": ver} if enq is None else {"dw-v": ver, "dw-e": enq},
        )
        raw = encode(msg) if body is None else body
        units = topo.delay_units(run_at - self.clock.now())
        if units > 0:
            return self.names.level(topo.LEVELS - 1), topo.delay_key(units, target), raw, props
        return "", target, raw, props

    def _park(self, raw: Raw, until: float) -> tuple[str, str, bytes, spec.Basic.Properties]:
        """Send a copy as it came back into the cascade until ``until``."""
        lane_queue = self.names.lane(raw.queue, raw.lane)
        units = max(1, topo.delay_units(until - self.clock.now()))
        props = spec.Basic.Properties(
            content_type="application/json",
            delivery_mode=2,
            message_id=raw.message_id or None,
            headers={
                # a string: AMQP tables carry a Python float as a 32-bit float,
                # which is up to a minute off at today's epoch (_seen)
                "dw-seen": f"{self.clock.now():.6f}",
                **{k: v for k, v in raw.headers.items() if k.startswith("dw-")},
            },
        )
        key = topo.delay_key(units, lane_queue)
        return self.names.level(topo.LEVELS - 1), key, raw.body, props

    def _dead_copy(
        self, msg: Message | None, queue: str, body: bytes | None = None
    ) -> tuple[str, str, bytes, spec.Basic.Properties]:
        """A dead letter for the DLQ: the whole envelope in the body, the error
        history (without tracebacks) in headers for people reading the DLQ."""
        headers: dict[str, Any] = {}
        if msg is not None:
            errs = msg.errors
            headers["x-dw-attempts"] = msg.attempt
            headers["x-dw-errors"] = orjson.dumps(
                [
                    {"attempt": e.attempt, "type": e.type, "message": e.message[:500]}
                    for e in errs[-20:]
                ]
            ).decode()
            if errs:
                headers["x-dw-error-type"] = errs[-1].type
                headers["x-dw-error-message"] = errs[-1].message[:1000]
        props = spec.Basic.Properties(
            content_type="application/json" if body is None else None,
            delivery_mode=2,
            message_id=None if msg is None else msg.id,
            headers=headers,
        )
        raw = body if body is not None else (encode(msg) if msg is not None else b"")
        return self.names.dlx, queue, raw, props

    def _raw_copy(self, rec: Record) -> tuple[str, str, bytes, spec.Basic.Properties]:
        """A copy of an undecodable message's record (``Record.raw``): its
        body as it came, to its queue's main lane, naming its record
        (``dw-raw``) and version: a worker that cannot decode it again
        dead-letters it under that record, not as a new one."""
        assert rec.raw is not None
        props = spec.Basic.Properties(
            delivery_mode=2,
            message_id=rec.msg.id,
            headers={"dw-v": rec.ver, "dw-raw": rec.msg.id},
        )
        return "", self.names.lane(rec.msg.queue), rec.raw, props

    def _copy_of(self, rec: Record, run_at: float) -> tuple[str, str, bytes, spec.Basic.Properties]:
        """A new copy of ``rec``'s job at its version, due at ``run_at``."""
        if rec.raw is not None:
            return self._raw_copy(rec)
        return self._copy(rec.msg, rec.ver, run_at)

    async def _send(
        self, items: list[tuple[str, str, bytes, spec.Basic.Properties]], persist: bool = False
    ) -> None:
        """Publish with confirms; with ``persist``, again on a new connection
        while RabbitMQ is unreachable, for up to ``reconnect`` seconds (a copy
        sent twice is harmless: the ledger runs a job once per version)."""
        if not items:
            return
        # without ``persist``, one try (a worker's send: its loops try again)
        backoff = Backoff(self.reconnect) if persist else None
        while True:
            link = self._link_for_loop()
            try:
                await self._ensure(link)
                if any(ex.startswith(self.names.delays) for ex, *_ in items):
                    await self._ensure_cascade(link)
                for ex, rk in {(ex, rk) for ex, rk, *_ in items}:
                    target = self._target_of(ex, rk)
                    if target is not None:
                        await self._declare_queue(link, target[0])
                        await self._declare_lane(link, *target)
                    elif ex == self.names.dlx:
                        await self._declare_dlq(link, rk)
                await link.publish(items)
                # the next copy to one of these lanes needs no declare
                link.targets.update((ex, rk) for ex, rk, *_ in items if ex == "")
                return
            except SEND_ERRORS as exc:
                err = await self._failed(link, "publish", exc)
                pause = None
                if backoff is not None and not isinstance(err, BrokerConfigError):
                    pause = backoff.pause()  # a refused login or vhost: never again
                if pause is None:
                    if backoff is not None:
                        err = self.failure(err, backoff.waited)
                    client = exc.__cause__ if isinstance(exc, BrokerError) else None
                    raise err from (client or exc)
                await asyncio.sleep(pause)

    def _target_of(self, exchange: str, routing_key: str) -> tuple[str, str] | None:
        """(queue, lane) a copy is for: sent to a lane by name, or through the
        cascade with the lane's name after the delay bits."""
        if exchange == "":
            lane_queue = routing_key
        elif exchange == self.names.level(topo.LEVELS - 1):
            lane_queue = routing_key.split(".", topo.LEVELS)[-1]
        else:
            return None
        for lane in topo.LANES:
            head = f"{self.names.prefix}.{lane}."
            if lane_queue.startswith(head):
                return lane_queue[len(head) :], lane
        return None

    # -- enqueue -----------------------------------------------------------------------

    async def enqueue(self, msgs: Iterable[Message]) -> list[str]:
        batch = [(m, encode_checked(m, self.max_message_size)) for m in msgs]
        if not batch:
            return []
        now = await self._now()
        k = self.keys
        if len(batch) == 1 and (batch[0][0].key is None or batch[0][0].kind != TASK):
            return [await self._enqueue_one(*batch[0], now)]
        existing = await self.state.kv_get([k.job + m.id for m, _ in batch])
        enq = os.urandom(8).hex()
        ids: list[str] = []
        fresh: list[tuple[Record, bytes]] = []
        taken_keys: dict[str, str] = {}
        seen: set[str] = set()
        for m, raw in batch:
            if k.job + m.id in existing or m.id in seen:
                ids.append(m.id)
                continue
            if m.key is not None and m.kind == TASK:
                holder = taken_keys.get(m.key) or await self._key_holder(m, now)
                if holder is not None:
                    ids.append(holder)
                    continue
                taken_keys[m.key] = m.id
            due = max(now, self.clock.to_server(m.eta)) if m.eta is not None else now
            state = State.SCHEDULED if due > now else State.READY
            fresh.append((Record(msg=m, state=state, run_at=due, updated_at=now, enq=enq), raw))
            seen.add(m.id)
            ids.append(m.id)
        if not fresh:
            return ids
        written = {k.job + r.msg.id: r.dump() for r, _ in fresh}
        # The records are written while the copies are published, as in
        # ``_enqueue_one``, with this call's token in both: a copy of an id
        # another call wrote meanwhile (the check above is a read) runs only
        # if the record is this call's.
        store = asyncio.ensure_future(_after_send(self.state.kv_set, written))
        try:
            await self._send([self._copy(r.msg, 0, r.run_at, raw, enq) for r, raw in fresh], True)
        except BaseException:
            # nothing of the batch may stay: forget the records and keys
            try:
                await store
            except BaseException:
                log.exception("could not write the records of a failed enqueue")
            try:
                await self.state.kv_delete([*written, *(k.key + key for key in taken_keys)])
            except Exception:
                log.exception("could not forget the records of a failed enqueue")
            raise
        await store  # raises if they could not be written (see ``_enqueue_one``)
        return ids

    async def _enqueue_one(self, m: Message, raw: bytes, now: float) -> str:
        """One job without a unique key (the usual producer call): its record
        is added (only if absent: the same call checks for a duplicate id)
        *while* its copy is published and confirmed, and the call returns when
        both are done, so it takes the longer of the two, not their sum, and
        ``get(id)`` after it finds the job.

        The record and the copy carry one token of this call (``Record.enq``,
        the copy's ``dw-e`` header): a worker drops the copy if the record
        it finds holds another call's token (``_other_enqueue``).  So a
        second enqueue of an existing id, whose ``kv_add`` loses, leaves a
        copy that is dropped and never runs with its own arguments; it
        returns the id, as when the record was written first.  A copy that
        reaches a worker before its record commits waits in the worker,
        judged again after a fraction of a millisecond and then more
        (``FIRST_RECHECK``, ``LOCAL_GRACE``), and past that the
        ``RECORD_GRACE`` rule: a producer that died between the copy's
        confirm and the record's commit leaves a copy that runs once, from
        itself; one that died after the record and before the publish leaves
        a record without a copy (its call never returned), which the
        reconcile sends again (``_reconcile``).
        """
        due = max(now, self.clock.to_server(m.eta)) if m.eta is not None else now
        enq = os.urandom(8).hex()
        rec = Record(
            msg=m,
            state=State.SCHEDULED if due > now else State.READY,
            run_at=due,
            updated_at=now,
            enq=enq,
        )
        key = self.keys.job + m.id
        copy = self._copy(m, 0, due, raw, enq)
        # written while RabbitMQ (a quorum queue: its log's commit) confirms
        # the copy, so it normally commits long before the copy is handed out
        add = asyncio.ensure_future(_after_send(self.state.kv_add, key, rec.dump()))
        try:
            await self._send([copy], True)
        except BaseException as exc:
            return await self._unsent(m, key, add, exc)
        await add  # raises if the record could not be written
        return m.id

    async def _unsent(
        self, m: Message, key: str, written: Awaitable[bool], exc: BaseException
    ) -> str:
        """The end of a single enqueue whose copy could not be sent: forget its
        record if this call wrote it, and raise; the id if the record was
        another enqueue's (the failed copy was a duplicate's)."""
        try:
            ours = await written
        except BaseException:
            ours = False  # not written: nothing to forget, the send's error stands
            log.exception("could not write the record of a failed enqueue")
        else:
            if not ours and isinstance(exc, Exception):
                return m.id  # enqueued before: the failed copy was a duplicate's
        if ours:
            try:
                await self.state.kv_delete([key])
            except Exception:
                log.exception("could not forget the record of a failed enqueue")
        raise exc

    async def _key_holder(self, m: Message, now: float) -> str | None:
        """The id of the job holding ``m.key`` (None: the key is now ``m``'s).

        A held key is taken over (its holder is gone or done) in one
        ``kv_update`` of the key's entry and its holder's record, only if
        the entry still names the holder read: two producers that both
        found the holder done cannot both take the key (each stored its job,
        a duplicate), and the one that comes second reads the new holder."""
        assert m.key is not None
        kk = self.keys.key + m.key
        blocks = _UNIQUE_BLOCKS.get(m.headers.get("unique", ""), frozenset(State))
        for _ in range(KEY_ROUNDS):
            if await self.state.kv_add(kk, m.id.encode()):
                return None
            holder = (await self.state.kv_get([kk])).get(kk, b"").decode()
            rk = self.keys.job + holder

            def decide(got: dict[str, bytes], holder: str = holder, rk: str = rk) -> _Taken:
                if got.get(kk, b"").decode() != holder:
                    return {}, _AGAIN  # taken over or freed since the read: read again
                raw = got.get(rk) if holder else None
                if raw is not None and Record.load(raw).shown_state(now) in blocks:
                    return {}, holder
                return {kk: m.id.encode()}, None  # the holder is gone or done

            taken = await self.state.kv_update([kk, rk] if holder else [kk], decide)
            if taken is not _AGAIN:
                return taken
        raise BrokerError(f"rabbitmq enqueue: the unique key {m.key!r} kept changing hands")

    # -- events ---------------------------------------------------------------------------

    async def publish(self, msgs: Iterable[Message]) -> int:
        batch = [(m, encode_checked(m, self.max_message_size)) for m in msgs]
        if not batch:
            return 0
        k = self.keys
        log_keys = [k.log_prefix(m.name) + m.id for m, _ in batch]
        existing = await self.state.kv_get(log_keys)
        fresh: list[tuple[Message, bytes]] = []
        seen: set[str] = set()
        for (m, raw), lk in zip(batch, log_keys, strict=True):
            if lk not in existing and m.id not in seen:
                seen.add(m.id)
                fresh.append((m, raw))
        if not fresh:
            return 0
        bindings = await self._load_bindings()
        now = await self._now()
        logged: dict[str, bytes] = {}
        records: dict[str, bytes] = {}
        copies: list[tuple[str, str, bytes, spec.Basic.Properties]] = []
        n = 0
        link = await self._link()
        for e, raw in fresh:
            logged[k.log_prefix(e.name) + e.id] = orjson.dumps({"m": e.to_dict(), "at": now})
            targets = [b for b in bindings if topo.topic_matches(b.pattern, e.name)]
            due = max(now, self.clock.to_server(e.eta)) if e.eta is not None else now
            dms = [delivery_of(e, b, delivery_id(e.id, b.queue)) for b in targets]
            for dm in dms:
                state = State.SCHEDULED if due > now else State.READY
                rec = Record(msg=dm, state=state, run_at=due, updated_at=now)
                records[k.job + dm.id] = rec.dump()
            n += len(dms)
            if due <= now and e.priority == 0:
                # one copy; RabbitMQ fans it out to the bound group queues
                try:
                    exchange = await self._events_exchange(link, e.name)
                except AMQP_ERRORS as exc:
                    raise await self._failed(link, "publish", exc) from exc
                props = spec.Basic.Properties(
                    content_type="application/json",
                    delivery_mode=2,
                    message_id=e.id,
                    headers={"dw-type": e.name},
                )
                rk = e.name if self.exchange_type in ("topic", "direct") else ""
                copies.append((exchange, rk, raw, props))
            else:  # delayed or prioritised: one copy per group, through its lane
                copies += [self._copy(dm, 0, due) for dm in dms]
        await self.state.kv_set(logged, ttl=self.event_retention)
        if records:
            await self.state.kv_set(records)
        try:
            await self._send(copies, True)
        except BaseException:
            try:
                await self.state.kv_delete([*logged, *records])
            except Exception:
                log.exception("could not forget the records of a failed publish")
            raise
        return n

    async def list_events(
        self,
        event_type: str,
        since: float | None = None,
        until: float | None = None,
        cursor: str | None = None,
        limit: int = 500,
    ) -> tuple[list[Message], str | None]:
        from ...message import from_dict

        logged = [
            (float(d["at"]), from_dict(d["m"]))
            for d in map(
                orjson.loads, (await self.state.kv_scan(self.keys.log_prefix(event_type))).values()
            )
        ]
        return events_page(logged, since, until, cursor, limit)

    # -- fetch -------------------------------------------------------------------------------

    async def fetch(
        self, queues: Sequence[str], limit: int, lease: float, wait: float, worker: str = ""
    ) -> list[Delivery]:
        link = await self._link()
        try:
            for q in queues:
                await self._declare_queue(link, q)
            if wait <= 0:
                return await self._fetch_now(link, queues, limit, lease, worker)
            return await self._fetch_wait(link, queues, limit, lease, wait, worker)
        except AMQP_ERRORS as exc:
            raise await self._failed(link, "fetch", exc) from exc

    def _from_buffer(self, link: Link, queues: Sequence[str], limit: int) -> list[Raw]:
        wanted = set(queues)
        picked: list[Raw] = []
        skipped: list[Raw] = []
        buffer = link.buffer
        # from the head, only as far as needed: with a large prefetch the
        # buffer holds many more copies than one fetch takes
        while buffer and len(picked) < limit:
            raw = buffer.popleft()
            (picked if raw.queue in wanted else skipped).append(raw)
        if skipped:
            buffer.extendleft(reversed(skipped))
        order = {lane: i for i, lane in enumerate(topo.LANES)}
        picked.sort(key=lambda r: order[r.lane])  # high lane first (a stable sort)
        return picked

    async def _fetch_now(
        self, link: Link, queues: Sequence[str], limit: int, lease: float, worker: str
    ) -> list[Delivery]:
        """``wait=0``: what is ready now, exactly, by ``basic.get`` in lane order."""
        out: list[Delivery] = []
        lanes = await self._lanes(queues)
        _recheck_due(link, self.clock.now())
        while len(out) < limit:
            raws = self._from_buffer(link, list(lanes), limit - len(out))
            for q, qlanes in lanes.items():
                for lane in qlanes:
                    while len(raws) < limit - len(out):
                        raw = await link.get(self.names.lane(q, lane), q, lane)
                        if raw is None:
                            break
                        raws.append(raw)
            if not raws:
                # A copy RabbitMQ pushed to this link's consumer (a fetch
                # that waited earlier left it on the queue) is not in the
                # queue for a get: it was in flight.  The channel answers a
                # get after what it delivered before, so such a copy has
                # reached the buffer by the time the get came back empty.
                raws = self._from_buffer(link, list(lanes), limit - len(out))
            if not raws:
                break
            out += await self._admit(link, raws, lease, worker)
        return out

    async def _fetch_wait(
        self,
        link: Link,
        queues: Sequence[str],
        limit: int,
        lease: float,
        wait: float,
        worker: str,
    ) -> list[Delivery]:
        """``wait>0``: consumers push into this link's buffer; return as soon
        as something is in.  The consumer prefetch is ``prefetch=``, or sized
        by ``_watch`` from the slots the worker asked for first (its
        concurrency) and the rate it drains at."""
        deadline = time.monotonic() + wait
        link.slots = link.slots or max(1, limit)
        while True:
            gen = link.gen
            if not self.prefetch and link.prefetch:
                now = self.clock.now()
                if now - link.settled_since >= PREFETCH_WINDOW:
                    await link.resize(self._prefetch_for(link, now))
            await self._watch(link, queues)
            _recheck_due(link, self.clock.now())
            for _ in range(2):  # let deliveries already read off the socket land
                if not link.buffer or len(link.buffer) >= limit:
                    break
                await asyncio.sleep(0)
            raws = self._from_buffer(link, queues, limit)
            if raws:
                out = await self._admit(link, raws, lease, worker)
                if out:
                    return out
                continue
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return []
            link.arrived.clear()
            now = self.clock.now()
            recheck = min(remaining, max(0.01, link.looked_at + 1.0 - now))
            if link.waiting:  # a copy waiting for its record: judge it again on time
                recheck = min(recheck, max(0.0, min(r.recheck_at for r in link.waiting) - now))
            try:
                await asyncio.wait_for(link.arrived.wait(), recheck)
            except TimeoutError:
                pass
            if gen != link.gen or not link.ok():
                raise BrokerError("rabbitmq: the connection was lost during a fetch")

    async def _lanes(self, queues: Sequence[str]) -> dict[str, list[str]]:
        """The lanes of each queue that is not paused, in fetch order (one read)."""
        k = self.keys
        wanted = [k.paused + q for q in queues]
        wanted += [f"{k.lane}{q}\x1f{lane}" for q in queues for lane in (topo.HIGH, topo.LOW)]
        got = await self.state.kv_get(wanted)
        return {
            q: [lane for lane in topo.LANES if lane == topo.MAIN or f"{k.lane}{q}\x1f{lane}" in got]
            for q in queues
            if k.paused + q not in got
        }

    async def _watch(self, link: Link, queues: Sequence[str]) -> None:
        """Consume every lane of ``queues`` that is not paused; look again
        every second for pauses lifted and priority lanes made since, and
        start consumers with the prefetch of the others (``_prefetch_for``)."""
        now = await self._now()
        if now >= link.looked_at + 1.0 or any(q not in link.looked for q in queues):
            prefetch = link.prefetch or self.prefetch or 2 * link.slots
            lanes = await self._lanes(queues)
            link.looked_at, link.looked = now, set(queues)
            for q in queues:
                if q in lanes:
                    link.paused_until.pop(q, None)
                    for lane in lanes[q]:
                        await link.consume(self.names.lane(q, lane), q, lane, prefetch)
                elif q not in link.paused_until:
                    link.paused_until[q] = now + 1.0
                    for lq in self.names.lanes(q):
                        await link.cancel(lq)

    def _prefetch_for(self, link: Link, now: float) -> int:
        """The consumers' prefetch: ``prefetch=`` if the URL sets it, else
        the worker's slots plus what it drains in ``PREFETCH_HORIZON``, at
        least twice its slots (the most a worker holds itself: running jobs
        plus its own prefetch of short jobs) and at most ``PREFETCH_MAX``.

        RabbitMQ hands a consumer a new message only once an ack has freed a
        slot, and a quorum queue frees it only after the ack is committed
        to its log (a few ms on a disk that syncs): a prefetch that covers
        only what the worker holds leaves a fast worker waiting for every
        refill (W1's drain: ~5,000/s with 64, ~7,500/s with 256, same
        machine and minutes).  Slow jobs keep the prefetch at twice the
        slots, so a worker never holds more than ``PREFETCH_HORIZON`` of
        work that another worker could have started.  The rate is measured
        over ``PREFETCH_WINDOW`` (a 10,000-job backlog drains in about a
        second: the prefetch must grow within a tenth of it), and the size
        changes only when the new one is half or twice the current one (or
        more), so that a steady rate does not re-consume; back to the floor
        (twice the slots) it goes at once, so slow jobs after a burst get
        exactly the prefetch they had before it."""
        if self.prefetch:
            return self.prefetch
        base = 2 * link.slots
        span = now - link.settled_since
        rate = link.settled / span if link.settled_since and span > 0 else 0.0
        link.settled, link.settled_since = 0, now
        want = min(PREFETCH_MAX, max(base, link.slots + math.ceil(rate * PREFETCH_HORIZON)))
        current = link.prefetch or base
        if want != base and current // 2 < want < current * 2:
            return current
        return want

    async def _admit(
        self, link: Link, raws: list[Raw], lease: float, worker: str
    ) -> list[Delivery]:
        """Judge copies against their records: run, drop (stale), park (its job
        is leased to a live worker, or not due yet) or dead-letter.

        The records are read, judged and the leases written in one
        ``kv_update`` (one transaction and one trip on a SQLite state store:
        two workers handed copies of one job, a copy sent twice, cannot both
        lease it).  Only a fanned-out event without a record takes another
        trip, for its group's binding."""
        k = self.keys
        now = self.clock.now()
        parsed, out = _parse(raws, now + lease)
        verdicts = await self._verdicts(link, raws, parsed, now, lease, worker)
        drop: list[int] = []
        requeue: list[int] = []
        parks: list[tuple[str, str, bytes, spec.Basic.Properties]] = []
        deads: list[tuple[str, str, bytes, spec.Basic.Properties]] = []
        late: dict[str, bytes] = {}
        for (raw, _, did, ev), (verdict, rec) in zip(parsed, verdicts, strict=True):
            if verdict is _REQUEUE:
                requeue.append(raw.tag)
                continue
            if verdict is _WAIT:  # unacked, in the link, judged again shortly
                _wait(link, raw, now)
                continue
            if verdict is _BIND and ev is not None:
                binding = await self._binding(raw.queue, ev.name)
                msg = delivery_of(ev, binding, did)
                verdict = _TAKE
                rec = Record(msg=msg, state=State.READY, run_at=now, updated_at=now)
                self._lease(rec, now, lease, worker)
                late[k.job + did] = rec.dump()
            if verdict is _PARK:
                assert rec is not None
                until = rec.lease_until + topo.UNIT if rec.state is State.RUNNING else rec.run_at
                parks.append(self._park(raw, until))
            elif verdict is _DEAD:
                assert rec is not None
                deads.append(self._dead_copy(rec.msg, raw.queue))
                # stored dead by the verdicts' transaction: report it even if
                # the DLQ copy below fails (its redelivery is then dropped)
                self._found_dead.append(
                    DeadLetter(did, raw.queue, rec.msg.name, rec.msg.errors[-1], rec.msg.copy())
                )
            if verdict is not _TAKE or rec is None:
                drop.append(raw.tag)
                continue
            self._held[did] = (rec.token, rec.lease_until)
            self._recs[did] = rec
            out.append(
                Delivery(
                    id=did,
                    message=rec.msg.copy(),
                    token=Token(rec.token, raw.gen, raw.tag),
                    lease_until=rec.lease_until,
                    queue=raw.queue,
                )
            )
        if late:
            late[k.lease + self.instance] = self._lease_map(now)
            await self.state.kv_set(late)
        if requeue:  # paused since the consumers started: stop them, then give back
            for q in {raw.queue for raw in raws if raw.tag in requeue}:
                link.paused_until[q] = now + 1.0
                for lq in self.names.lanes(q):
                    await link.cancel(lq)
            await link.nack(link.gen, requeue)
        if parks or deads:
            await self._send(parks + deads)
        if drop:
            await link.ack(link.gen, drop)
        return out

    async def _verdicts(
        self,
        link: Link,
        raws: list[Raw],
        parsed: list[tuple[Raw, Message, str, Message | None]],
        now: float,
        lease: float,
        worker: str,
    ) -> list[_Verdict]:
        """``_decide`` in one ``kv_update`` of the copies' records, tombstones
        and pause flags."""
        k = self.keys
        wanted = [k.job + did for _, _, did, _ in parsed]
        wanted += [k.claim + "gone:" + did for _, _, did, _ in parsed]
        wanted += [k.paused + q for q in {raw.queue for raw in raws}]
        rides, link.riders = link.riders, []
        carried: dict[str, KvWrite] = {}
        for ride in rides:
            ride.taken = True
            carried.update(ride.writes)
        # the lease map's base, read on this thread; the jobs whose acks
        # ride here are finished by the same write
        held = dict(self._held)
        for ride in rides:
            for id_ in ride.ids:
                held.pop(id_, None)

        def decide(got: dict[str, bytes]) -> tuple[dict[str, KvWrite], list[_Verdict]]:
            if not carried:
                return self._decide(parsed, got, held, now, lease, worker)
            # judged as if the carried acks were written first (a copy of
            # an acked job is then dropped, not leased over its success)
            seen = dict(got)
            for key in wanted:
                if key in carried:
                    seen[key] = kv_write(carried[key])[0]
            writes, verdicts = self._decide(parsed, seen, held, now, lease, worker)
            return {**carried, **writes}, verdicts

        try:
            verdicts = await self.state.kv_update(wanted, decide)
        except BaseException as exc:
            for ride in rides:  # not written: their acks raise, and are made again
                if not ride.done.done():
                    ride.done.set_exception(
                        BrokerError(f"rabbitmq ack: the admission carrying it failed: {exc!r}")
                    )
            # the state store failed (or the fetch was cancelled): the copies
            # go back to the head of the buffer, to be judged again by the
            # next fetch; left out, they would stay unacked on a live
            # connection, each holding a slot of the consumer's prefetch
            if raws and raws[0].gen == link.gen:
                link.buffer.extendleft(reversed(raws))
            raise
        for ride in rides:
            if not ride.done.done():
                ride.done.set_result(None)
        return verdicts

    def _decide(
        self,
        parsed: list[tuple[Raw, Message, str, Message | None]],
        got: dict[str, bytes],
        held: dict[str, tuple[int, float]],
        now: float,
        lease: float,
        worker: str,
    ) -> tuple[dict[str, KvWrite], list[_Verdict]]:
        """The admission's verdicts and writes (the leased records and this
        broker's lease map, ``held`` plus them), given the records read.

        Two copies of one job in a batch are each judged against the record
        read, except after one of them took the job (leased it, buried it,
        or took an event's delivery without a record): the later one is a
        twin, dropped.  A copy judged stale does not make the next one a
        twin: a killed worker's original, given back by RabbitMQ, and the
        copy its rescue sent can meet in one batch, the original first
        (stale: the rescue bumped the version); had it counted, both would
        be dropped and the ready record left with no copy to serve it.

        Runs in the state store's transaction, maybe twice, maybe on its
        thread: it reads only its arguments, builds new records and changes
        nothing shared."""
        k = self.keys
        writes: dict[str, KvWrite] = {}
        verdicts: list[_Verdict] = []
        leased = dict(held)
        #: jobs an earlier copy of this batch took: their record is no longer the one read
        taken: set[str] = set()
        for raw, m, did, ev in parsed:
            if k.paused + raw.queue in got:
                verdicts.append((_REQUEUE, None))
                continue
            if did in taken:  # a second copy of a job this very batch took
                verdicts.append((_DROP, None))
                continue
            if ev is not None and k.job + did not in got and k.claim + "gone:" + did not in got:
                taken.add(did)
                verdicts.append((_BIND, None))  # its record comes with the binding
                continue
            verdict, rec = self._judge(raw, m, did, ev, got, now)
            if verdict is _DEAD:
                assert rec is not None
                writes[k.job + did] = rec.dump()
                taken.add(did)
            elif verdict is _TAKE and rec is not None:
                if rec.msg is m:  # the parsed copy's: not this call's to change
                    rec.msg = m.copy()
                self._lease(rec, now, lease, worker)
                writes[k.job + did] = rec.dump()
                leased[did] = (rec.token, rec.lease_until)
                taken.add(did)
            verdicts.append((verdict, rec))
        if writes:
            writes[k.lease + self.instance] = orjson.dumps({"at": now, "held": leased})
        return writes, verdicts

    @staticmethod
    def _lease(rec: Record, now: float, lease: float, worker: str) -> None:
        """Make ``rec`` the record of a job leased to ``worker`` from ``now``."""
        rec.state = State.RUNNING
        rec.msg.attempt += 1
        rec.token += 1
        rec.lease_until = now + lease
        rec.worker = worker or None
        rec.updated_at = now

    def _judge(
        self,
        raw: Raw,
        m: Message,
        did: str,
        ev: Message | None,
        got: Mapping[str, bytes],
        now: float,
    ) -> tuple[str, Record | None]:
        """What to do with one copy: ``_TAKE`` (run it), ``_DROP`` (stale: its
        job was retried, rescued, rescheduled, cancelled, purged or finished
        since), ``_PARK`` (its job is leased to a live worker, or not due) or
        ``_DEAD`` (its worker died holding the last attempt).  A fanned-out
        event without a record (its publisher knew no binding) is the
        caller's: it needs the binding, read from the state store."""
        k = self.keys
        rec_raw = got.get(k.job + did)
        ver = _ver_of(raw)
        if rec_raw is None:
            if k.claim + "gone:" + did in got:
                return _DROP, None  # purged: its tombstone outlives its copies
            return _unrecorded(raw, m, ver, now)
        rec = Record.load(rec_raw, None if ev is not None else m, ver)
        if _other_enqueue(_enq_of(raw), rec.enq):
            return _DROP, None  # another enqueue's copy: that one's record won
        if ver < rec.ver:
            return _DROP, None
        if ver > rec.ver:
            # judged before the state: a replay's copy is sent while its
            # record still says dead, and must wait for the record
            ahead = _ahead(raw, m, rec, ver, now)
            if ahead is not None:
                return ahead
        elif rec.state in FINAL_STATES:
            return _DROP, None
        if rec.state is State.RUNNING:
            if not raw.redelivered and "dw-seen" not in raw.headers:
                return _DROP, None  # a copy sent twice (a publish tried again)
            if rec.lease_until > now:
                return _PARK, rec  # its worker's connection closed: wait out the lease
            # its worker's connection died and its lease ran out
            rec.msg.errors.append(_lease_error(rec, now, "its connection closed"))
            if rec.msg.attempt >= rec.msg.max_attempts:
                rec.state, rec.updated_at = State.DEAD, now
                rec.ver += 1
                return _DEAD, rec
            return _TAKE, rec
        if rec.run_at > now + 0.001:
            return _PARK, rec  # early: not due yet
        return _TAKE, rec

    async def _binding(self, queue: str, event_type: str) -> Binding:
        for refresh in (False, True):
            bindings = await self._load_bindings() if refresh else self._bindings
            for b in bindings:
                if b.queue == queue and topo.topic_matches(b.pattern, event_type):
                    return b
        return Binding(event_type, queue)

    def _lease_map(self, now: float) -> bytes:
        return orjson.dumps({"at": now, "held": self._held})

    # -- outcomes --------------------------------------------------------------------------

    async def _owned(self, ds: Sequence[Delivery]) -> list[tuple[Delivery, Record]]:
        """The deliveries whose lease is still theirs, with their records.

        A lease with more than ``SURE`` seconds to run is ours without asking
        the state store: only an expired lease is rescued or taken over (and
        admin calls never touch running jobs), so the record this broker
        wrote at fetch or heartbeat is still the record.  Others are read."""
        k = self.keys
        now = await self._now()
        out = []
        ask = []
        for d in ds:
            tok = d.token
            if d.message is None or not isinstance(tok, Token):
                continue
            rec = self._recs.get(d.id)
            if rec is not None and rec.token == tok.record and d.lease_until > now + SURE:
                out.append((d, rec))
            else:
                ask.append(d)
        got = await self.state.kv_get([k.job + d.id for d in ask]) if ask else {}
        for d in ask:
            raw = got.get(k.job + d.id)
            if raw is None:
                continue
            rec = Record.load(raw)
            tok = d.token
            if rec.state is State.RUNNING and isinstance(tok, Token) and rec.token == tok.record:
                out.append((d, rec))
        return out

    async def _finish(self, ds: Sequence[Delivery]) -> None:
        """Ack the deliveries' AMQP messages and forget their leases."""
        for d in ds:
            if self._held.get(d.id, (None,))[0] == getattr(d.token, "record", None):
                self._held.pop(d.id, None)
                self._recs.pop(d.id, None)
        link = self._links.get(asyncio.get_running_loop())
        if link is None:
            return
        by_gen: dict[int, list[int]] = {}
        for d in ds:
            if isinstance(d.token, Token):
                by_gen.setdefault(d.token.gen, []).append(d.token.tag)
        try:
            for gen, tags in by_gen.items():
                await link.ack(gen, tags)
        except AMQP_ERRORS as exc:  # RabbitMQ puts them back; the ledger drops them
            await self._failed(link, "ack", exc)

    async def ack(self, ds: Sequence[Delivery]) -> None:
        """Succeeded records, kept ``retention`` (or their result's time).

        A job that holds a unique key keeps it exactly as long as its record
        (a key without a unique mode blocks while its holder's record is
        kept): the key's entry gets the record's ttl in the same
        ``kv_update``, only if it still names the job (a newer job that took
        the key over keeps it, with no expiry).  Jobs without a key take one
        plain write, as before."""
        now = await self._now()
        records: dict[str, tuple[bytes, float]] = {}
        holds: list[tuple[str, str, float]] = []  # (key's entry, job id, ttl)
        for d, rec in await self._owned(ds):
            rec.state, rec.updated_at = State.SUCCEEDED, now
            rec.result = d.result
            ttl = d.result_ttl if d.result is not None and d.result_ttl else self.retention
            ttl = max(ttl, self.retention)
            records[self.keys.job + d.id] = (rec.dump(), ttl)
            kk = self._entry_of(rec)
            if kk is not None:
                holds.append((kk, d.id, ttl))
        if holds:

            def decide(got: dict[str, bytes]) -> tuple[dict[str, KvWrite], None]:
                writes: dict[str, KvWrite] = dict(records)
                for kk, id_, ttl in holds:
                    if got.get(kk, b"").decode() == id_:
                        writes[kk] = (id_.encode(), ttl)
                return writes, None

            await self.state.kv_update(sorted({kk for kk, _, _ in holds}), decide)
        elif records and not await self._ride(records, {d.id for d in ds}):
            by_ttl: dict[float, dict[str, bytes]] = {}
            for key, (raw, ttl) in records.items():
                by_ttl.setdefault(ttl, {})[key] = raw
            for ttl, items in by_ttl.items():
                await self.state.kv_set(items, ttl=ttl)
        await self._finish(ds)

    async def _ride(self, records: dict[str, tuple[bytes, float]], ids: set[str]) -> bool:
        """Write an ack's records with this loop's next admission, if one
        comes within ``RIDE_TURNS`` turns of the loop: True once written that
        way, False if none came (the caller writes them alone).

        A worker's finished jobs wake its settler (the ack) and its fetch
        loop (the next admission) together, and on a busy worker the
        admission's ``kv_update`` comes a few turns later: the records
        ride in it, one state-store trip for both.  Either way the records
        are written before the AMQP ack, as before."""
        link = self._links.get(asyncio.get_running_loop())
        if link is None:
            return False
        ride = _Ride(dict(records), ids, asyncio.get_running_loop().create_future())
        link.riders.append(ride)
        try:
            for _ in range(RIDE_TURNS):
                if ride.taken:
                    break
                await asyncio.sleep(0)
            if not ride.taken:
                return False
            await ride.done
            return True
        finally:
            if ride in link.riders:  # not taken (or cancelled while waiting)
                link.riders.remove(ride)

    def _entry_of(self, rec: Record) -> str | None:
        """The state-store key of the unique key ``rec``'s job was enqueued
        with (tasks only), whoever holds it now; None without one."""
        if rec.msg.key is None or rec.msg.kind != TASK:
            return None
        return self.keys.key + rec.msg.key

    async def retry(self, ds: Sequence[Delivery]) -> None:
        await self._again(ds, charge=True)

    async def requeue(self, ds: Sequence[Delivery]) -> None:
        await self._again(ds, charge=False)

    async def _again(self, ds: Sequence[Delivery], charge: bool) -> None:
        """A new copy, due at ``d.retry_at``; then the old one goes.

        The record is written only where it is still the lease read
        (``_swap``): ``_owned`` trusts a lease with more than ``SURE`` to
        run, and a publish slower than that lets the lease run out, the job
        be rescued and another worker take it.  A blind write then set the
        record back under that worker's running job (its ack fenced off, the
        rescue's copy and this one of one version: a job no copy served)."""
        now = await self._now()
        writes: dict[str, tuple[_Stamp, bytes]] = {}
        copies = []
        for d, rec in await self._owned(ds):
            before = _stamp(rec)
            if charge and d.error is not None:
                rec.msg.errors.append(d.error)
            if not charge:
                rec.msg.attempt = max(0, rec.msg.attempt - 1)
            rec.ver += 1
            rec.updated_at = now
            rec.run_at = max(self.clock.to_server(d.retry_at), now)
            rec.state = State.SCHEDULED if rec.run_at > now else State.READY
            copies.append(self._copy(rec.msg, rec.ver, rec.run_at))
            writes[self.keys.job + d.id] = (before, rec.dump())
        await self._send(copies, True)
        if writes:
            await self._swap(writes)
        await self._finish(ds)

    async def dead(self, ds: Sequence[Delivery]) -> None:
        """The job's copy to the DLQ, its record dead where it is still the
        lease read (``_swap``, as ``_again``)."""
        now = await self._now()
        writes: dict[str, tuple[_Stamp, bytes]] = {}
        copies = []
        for d, rec in await self._owned(ds):
            before = _stamp(rec)
            if d.error is not None:
                rec.msg.errors.append(d.error)
            rec.state, rec.updated_at = State.DEAD, now
            rec.ver += 1
            copies.append(self._dead_copy(rec.msg, rec.msg.queue))
            writes[self.keys.job + d.id] = (before, rec.dump())
        undecodable = [d for d in ds if d.message is None and isinstance(d.token, Token)]
        if undecodable:
            copies += await self._bury(undecodable, now)
        await self._send(copies, True)
        if writes:
            await self._swap(writes)
        await self._finish(ds)

    async def _bury(
        self, ds: Sequence[Delivery], now: float
    ) -> list[tuple[str, str, bytes, spec.Basic.Properties]]:
        """Dead records of messages that are not envelopes, written before
        their dead letters go to the DLQ (body as it came, error in headers,
        the record's id as message id, so that ``purge`` and ``replay`` take
        it out again): a dead job like any other for ``list_jobs``,
        ``stats``, ``get`` (with the body, ``Record.raw``), ``purge`` and
        ``replay``.  Kept only in the DLQ, no process but the one that
        logged it knew of it.  The copies to send.

        A message seen for the first time gets a record of its own (its
        delivery's new id); one a replay put back (``_raw_copy``) is dead
        again under its record, only if that record is still the ready one
        of the copy's version: a second copy of it (a reconcile's), or one
        purged since, is dropped.  A worker killed between the record and
        the ack leaves its message to be delivered again: a second record."""
        k = self.keys
        gone = k.claim + "gone:"
        fresh: dict[str, tuple[int, Record]] = {}
        for d in ds:
            assert isinstance(d.token, Token)
            err = d.error or ErrorRecord(
                time=now,
                type=f"dumbwaiter.errors.{MessageDecodeError.__name__}",
                message=d.decode_error or "undecodable body",
            )
            stub = Message(
                id=d.id, kind=TASK, name="?", queue=d.queue, attempt=1, created_at=now, errors=[err]
            )
            rec = Record(msg=stub, state=State.DEAD, run_at=now, updated_at=now, raw=d.raw or b"")
            fresh[d.id] = (d.token.record, rec)

        def decide(got: dict[str, bytes]) -> tuple[dict[str, bytes], list[Record]]:
            writes: dict[str, bytes] = {}
            buried: list[Record] = []
            for id_, (ver, new) in fresh.items():
                if gone + id_ in got:
                    continue  # purged after its replay: its copy is dropped
                old = got.get(k.job + id_)
                rec = new
                if old is not None:
                    rec = Record.load(old)
                    if rec.raw is None or rec.state is not State.READY or rec.ver != ver:
                        continue  # a stale copy (a twin, or replayed or purged since)
                    rec.msg.attempt += 1
                    rec.msg.errors.append(new.msg.errors[-1])
                    rec.state, rec.updated_at, rec.raw = State.DEAD, now, new.raw
                    rec.ver += 1
                writes[k.job + id_] = rec.dump()
                buried.append(rec)
            return writes, buried

        keys = [key for id_ in fresh for key in (k.job + id_, gone + id_)]
        buried = await self.state.kv_update(keys, decide)
        return [self._dead_copy(r.msg, r.msg.queue, r.raw) for r in buried]

    async def extend(self, ds: Sequence[Delivery], lease: float) -> list[Delivery]:
        """Move each lease still this worker's ``lease`` seconds ahead.

        The record is written only where it is still the one this worker
        holds (``_swap``'s compare, in one ``kv_update`` with the lease map):
        a rescue, or another worker's takeover of the expired lease, may
        have come between ``_owned``'s look and this write, and a blind
        write would set the job back under that worker (its ack fenced off)
        or undo a rescue's dead letter.  Such a lease is reported lost.  The
        rescuer's compare includes the lease's end, so of a heartbeat and a
        rescue that meet, exactly one wins."""
        now = await self._now()
        k = self.keys
        planned: dict[str, tuple[_Stamp, bytes]] = {}
        renewed: dict[str, tuple[Delivery, Record]] = {}
        for d, rec in await self._owned(ds):
            new = replace(rec, lease_until=now + lease)
            planned[k.job + d.id] = (_stamp(rec), new.dump())
            renewed[k.job + d.id] = (d, new)
        lease_key = k.lease + self.instance
        held = dict(self._held)

        def decide(got: dict[str, bytes]) -> tuple[dict[str, bytes], set[str]]:
            writes = _swapped(planned, got)
            mine = dict(held)
            for key, (d, rec) in renewed.items():
                if key in writes:
                    mine[d.id] = (rec.token, rec.lease_until)
                else:
                    mine.pop(d.id, None)
            won = set(writes)
            writes[lease_key] = orjson.dumps({"at": now, "held": mine})
            return writes, won

        won = await self.state.kv_update(list(planned), decide)
        for key, (d, rec) in renewed.items():
            if key in won:
                d.lease_until = rec.lease_until
                self._held[d.id] = (rec.token, rec.lease_until)
                self._recs[d.id] = rec
        lost = [d for d in ds if d.message is not None and k.job + d.id not in won]
        for d in lost:
            if self._held.get(d.id, (None,))[0] == getattr(d.token, "record", None):
                self._held.pop(d.id, None)
                self._recs.pop(d.id, None)
        return lost

    async def rescue(self) -> Rescued:
        """Jobs whose lease ran out (their worker hung or died) get a new copy
        (or go dead); each is claimed once, so rescuers never double it.  The
        dead letters fetches found since the last call are reported (and
        counted) too; kept for the next call if this one fails.  Once every
        ``RECONCILE_EVERY`` s, waiting jobs left without a copy get one
        (``_reconcile``)."""
        found = list(self._found_dead)
        self._found_dead.clear()
        try:
            n, dead = await self._rescue_leases()
        except BaseException:
            self._found_dead.extendleft(reversed(found))
            raise
        if time.monotonic() >= self._reconcile_at:
            self._reconcile_at = time.monotonic() + RECONCILE_EVERY
            try:
                await self._reconcile()
            except Exception as exc:  # the next period tries again; the leases are done
                log.warning("rabbitmq reconcile failed: %r; trying again later", exc)
        return Rescued(n + len(found), found + dead)

    async def _reconcile(self) -> int:
        """Send a copy again for each job whose record waits, due long ago,
        in a lane RabbitMQ holds no message for: how many were sent.

        Such a record has no copy: its producer was killed while RabbitMQ
        was unreachable (the record is written while the copy is published,
        and the publish is tried again for ``reconnect`` s), or its failed
        enqueue could not delete it again.  Listed for ever, run never.  The
        record holds the message, so it is sent again, at the record's own
        version: should the first copy still exist after all (unacked in a
        worker's buffer), the two are one job's copies of one version, and
        the ledger runs it once (the second is dropped as a copy sent
        twice, or as a finished job's).

        Bounded: one process of the app per ``RECONCILE_EVERY`` (a claim in
        the state store), lanes looked at first (a passive declare each) and
        the records read only when one is empty; only records waiting in an
        empty lane (a lane with messages may still hold their copies:
        sending them again would put them behind the backlog), due more
        than ``STRANDED_AFTER`` plus ``reconnect`` s ago (the producer has
        given up, and deleted the record if it could), at most
        ``RECONCILE_MAX`` of them."""
        k = self.keys
        if not await self.state.kv_add(k.claim + "reconcile", b"1", ttl=RECONCILE_EVERY):
            return 0  # another process of the app does this period's
        empty = await self._empty_lanes()
        if not empty:
            return 0
        now = await self._now()
        horizon = now - STRANDED_AFTER - self.reconnect
        stranded: list[Record] = []
        for raw in (await self.state.kv_scan(k.job)).values():
            if not any(mark in raw for mark in _WAITING_MARKS):
                continue  # finished or running: most records, never parsed
            rec = Record.load(raw)
            if rec.state not in (State.READY, State.SCHEDULED):
                continue
            if max(rec.run_at, rec.updated_at) > horizon:
                continue
            lane = topo.MAIN if rec.raw is not None else topo.lane_of(rec.msg.priority)
            if self.names.lane(rec.msg.queue, lane) in empty:
                stranded.append(rec)
        if not stranded:
            return 0
        stranded.sort(key=lambda r: r.run_at)
        stranded = stranded[:RECONCILE_MAX]
        log.warning(
            "rabbitmq: %d waiting job(s) had no copy in their lane (their producer died"
            " before RabbitMQ confirmed it?); sending their copies again: %s",
            len(stranded),
            ", ".join(r.msg.id for r in stranded[:10]) + (" ..." if len(stranded) > 10 else ""),
        )
        await self._send([self._copy_of(r, now) for r in stranded])
        return len(stranded)

    async def _empty_lanes(self) -> set[str]:
        """The lanes (of every queue this app declared) that hold no ready
        message, by a passive declare each on a channel of its own (a lane
        that is gone closes it: it is opened again, and that lane skipped)."""
        k = self.keys
        lanes = {self.names.lane(q[len(k.queue) :]) for q in await self.state.kv_scan(k.queue)}
        for key in await self.state.kv_scan(k.lane):
            queue, lane = key[len(k.lane) :].split("\x1f", 1)
            lanes.add(self.names.lane(queue, lane))
        link = await self._link()
        if link.conn is None or not lanes:
            return set()
        empty: set[str] = set()
        ch = await link.conn.channel()
        try:
            for name in sorted(lanes):
                try:
                    ok = await ch.queue_declare(name, passive=True)
                except AMQP_ERRORS:
                    if not link.ok():
                        raise
                    ch = await link.conn.channel()  # the lane is gone: skip it
                    continue
                if not ok.message_count:
                    empty.add(name)
        finally:
            if not ch.is_closed:
                await ch.close()
        return empty

    async def _rescue_leases(self) -> tuple[int, list[DeadLetter]]:
        """``rescue`` of the expired leases: how many, and the dead-lettered."""
        now = await self._now()
        k = self.keys
        maps = await self.state.kv_scan(k.lease)
        expired: dict[str, int] = {}
        owners: dict[str, dict[str, Any]] = {}
        for key, raw in maps.items():
            d = orjson.loads(raw)
            owners[key] = d
            for id_, (token, until) in d["held"].items():
                if until < now:
                    expired[id_] = int(token)
        if not expired:
            return 0, []
        got = await self.state.kv_get([k.job + i for i in expired])
        planned: dict[str, tuple[_Stamp, bytes]] = {}
        copies = []
        claims: list[str] = []
        dead: dict[str, DeadLetter] = {}
        for id_, token in expired.items():
            found = got.get(k.job + id_)
            if found is None:
                continue
            rec = Record.load(found)
            if rec.state is not State.RUNNING or rec.token != token or rec.lease_until >= now:
                continue
            claim = f"{k.claim}rescue:{id_}:{token}"
            if not await self.state.kv_add(claim, b"1", ttl=3600):
                continue
            claims.append(claim)
            stamp = _stamp(rec)
            rec.msg.errors.append(_lease_error(rec, now, "it stopped heartbeating"))
            rec.ver += 1
            rec.updated_at = now
            if rec.msg.attempt >= rec.msg.max_attempts:
                rec.state = State.DEAD
                copies.append(self._dead_copy(rec.msg, rec.msg.queue))
                dead[k.job + id_] = DeadLetter(
                    id_, rec.msg.queue, rec.msg.name, rec.msg.errors[-1], rec.msg.copy()
                )
            else:
                rec.state, rec.run_at = State.READY, now
                copies.append(self._copy(rec.msg, rec.ver, now))
            planned[k.job + id_] = (stamp, rec.dump())
        # The copies go first (a rescuer that dies next loses nothing: a copy
        # ahead of its record wins after RECORD_GRACE).  The records are then
        # written only where they are still the expired lease read above:
        # since then, a redelivered copy may have taken the job over (its
        # admission leases an expired job) and even finished it; a blind write
        # would set that job back to ready after its new copy was judged
        # stale, a record no copy serves (the crash test's stuck jobs).  A
        # copy whose write lost is ahead of its record: dropped once the job
        # is finished, parked while it is leased (``_ahead``).
        try:
            await self._send(copies, True)
        except BaseException:
            # unclaimed, or these leases would wait out the claim's hour
            # before the next rescue (of this or another process) tried them
            try:
                await self.state.kv_delete(claims)
            except Exception:
                log.exception("could not release the claims of a failed rescue")
            raise
        won = await self._swap(planned) if planned else []
        dead_letters = [dead[key] for key in won if key in dead]
        # tidy other owners' lease maps: what is rescued or finished leaves them
        gone = [
            key
            for key, d in owners.items()
            if key != k.lease + self.instance
            and float(d["at"]) < now - 60
            and all(u < now for _, u in d["held"].values())
        ]
        if gone:
            await self.state.kv_delete(gone)
        return len(won), dead_letters

    # -- admin --------------------------------------------------------------------------------

    async def _records(self) -> list[Record]:
        found = await self.state.kv_scan(self.keys.job)
        return [Record.load(v) for v in found.values()]

    async def stats(self) -> list[QueueStats]:
        now = await self._now()
        k = self.keys
        queues = {q[len(k.queue) :] for q in await self.state.kv_scan(k.queue)}
        paused = {q[len(k.paused) :] for q in await self.state.kv_scan(k.paused)}
        counts: dict[str, dict[str, float]] = {q: {} for q in queues | paused}
        for rec in await self._records():
            c = counts.setdefault(rec.msg.queue, {})
            st = rec.shown_state(now)
            c[st.value] = c.get(st.value, 0) + 1
            if st is State.READY:
                c["lag"] = max(c.get("lag", 0.0), now - rec.run_at)
        return stats_rows(counts, paused)

    async def _matching(self, filter: JobFilter) -> list[Record]:
        now = await self._now()
        if filter.ids is not None:
            got = await self.state.kv_get([self.keys.job + i for i in filter.ids])
            recs = [Record.load(v) for v in got.values()]
        else:
            recs = await self._records()
        return [r for r in recs if filter.matches(r.info(now))]

    async def list_jobs(
        self, filter: JobFilter, cursor: str | None = None, limit: int = 50
    ) -> Page:
        now = self.clock.now()
        recs = sorted(await self._matching(filter), key=lambda r: r.msg.id, reverse=True)
        if cursor is not None:
            recs = [r for r in recs if r.msg.id < cursor]
        page = [r.info(now) for r in recs[:limit]]
        more = len(recs) > limit
        return Page(items=page, cursor=page[-1].message.id if more and page else None)

    async def get(self, id: str) -> JobInfo | None:
        got = await self.state.kv_get([self.keys.job + id])
        raw = got.get(self.keys.job + id)
        return None if raw is None else Record.load(raw).info(self.clock.now())

    async def replay(self, filter: JobFilter) -> int:
        """Dead jobs back to ready.  The new copies are confirmed first (a
        crash before the records are written loses nothing: a copy ahead of
        its record waits for it, even while it still says dead, and wins
        after ``RECORD_GRACE``), then the records change in one
        ``kv_update``, each only if it is still the record read (``_swap``):
        a job purged or replayed by another call meanwhile is left as that
        call made it, and its new copy here is dropped (stale, or a second
        copy of the same version).

        A dead letter that is not an envelope goes back to its queue as it
        came, as the SQL brokers put theirs back: its copy is sent after its
        record (no worker can judge a body it cannot decode against a
        version, so the record must be ready first; a crash in between
        leaves a ready record that ``_reconcile`` sends again), and a worker
        that still cannot decode it dead-letters it under the same record."""
        now = await self._now()
        planned: dict[str, tuple[_Stamp, bytes]] = {}
        copies = []
        raws: dict[str, Record] = {}
        for rec in await self._matching(filter):
            if rec.state is not State.DEAD:
                continue
            before = _stamp(rec)
            rec.msg.attempt = 0
            rec.replays += 1
            rec.ver += 1
            rec.state, rec.run_at, rec.updated_at = State.READY, now, now
            key = self.keys.job + rec.msg.id
            if rec.raw is not None:
                raws[key] = rec
            else:
                copies.append(self._copy(rec.msg, rec.ver, now))
            planned[key] = (before, rec.dump())
        if not planned:
            return 0
        await self._send(copies, True)
        won = await self._swap(planned)
        if won:
            await self._sweep_dlq({key[len(self.keys.job) :] for key in won})
        await self._send([self._raw_copy(raws[key]) for key in won if key in raws], True)
        return len(won)

    async def _swap(self, planned: Mapping[str, tuple[_Stamp, bytes]]) -> list[str]:
        """Write each planned record (key: (the read record's ``_stamp``, the
        new record)) only if the record is still the one read, in one
        ``kv_update`` (atomic on a SQLite state store): an admin call's
        read-then-write can no longer clobber a lease, cancel, retry, rescue
        or purge that came in between.  The keys written, in order.

        ``decide`` only parses what it was given: pure, safe to run twice."""

        def decide(got: dict[str, bytes]) -> tuple[dict[str, bytes], list[str]]:
            writes = _swapped(planned, got)
            return writes, list(writes)

        return await self.state.kv_update(list(planned), decide)

    async def purge(self, filter: JobFilter) -> int:
        """Delete the matching jobs that are not running.

        One ``kv_update`` marks the records cancelled (a new version), each
        only if it is still the record read (``_swap``'s rule): a job a
        worker leased (or another call changed) since the read is left
        alone, and a marked job can no longer be leased, replayed or
        rescheduled (every queued copy of it is dropped).  The same update
        frees the unique keys the marked jobs still hold (a newer job may
        have taken one over: the old job keeps its message's key, and
        freeing that one's key would let a duplicate in); a freed key's
        entry stays, empty, which ``_key_holder`` reads as free, since only
        a compare-and-delete could remove it safely.  The marks and the
        freed entries are written with the ttl of the jobs' tombstones, so a
        purge that dies before its deletes leaves nothing that stays.  Then
        tombstones and the deletes, which nothing can race any more."""
        k = self.keys
        read = [r for r in await self._matching(filter) if r.state is not State.RUNNING]
        if not read:
            return 0
        now = await self._now()
        planned: dict[str, tuple[_Stamp, bytes]] = {}
        ttls: dict[str, float] = {}  # job's record key -> how long its mark stays
        holds: dict[str, str] = {}  # job's record key -> its unique key's entry
        for r in read:
            before = _stamp(r)
            mark = Record.load(r.dump())
            mark.state, mark.updated_at = State.CANCELLED, now
            mark.ver += 1
            planned[k.job + r.msg.id] = (before, mark.dump())
            ttls[k.job + r.msg.id] = self._outlive(r, now)
            kk = self._entry_of(r)
            if kk is not None:
                holds[k.job + r.msg.id] = kk

        def decide(got: dict[str, bytes]) -> tuple[dict[str, KvWrite], set[str]]:
            marks = _swapped(planned, got)
            writes: dict[str, KvWrite] = {key: (v, ttls[key]) for key, v in marks.items()}
            for key in marks:
                kk = holds.get(key)
                if kk is not None and got.get(kk, b"").decode() == key[len(k.job) :]:
                    writes[kk] = (b"", ttls[key])
            return writes, set(marks)

        won = await self.state.kv_update([*planned, *sorted(set(holds.values()))], decide)
        gone = [r for r in read if k.job + r.msg.id in won]
        if not gone:
            return 0
        # a tombstone each, kept until every copy still queued has come up
        # (a copy without a record would otherwise run)
        ttl = max(ttls[k.job + r.msg.id] for r in gone)
        await self.state.kv_set({k.claim + "gone:" + r.msg.id: b"1" for r in gone}, ttl=ttl)
        await self.state.kv_delete([k.job + r.msg.id for r in gone])
        await self._sweep_dlq({r.msg.id for r in gone if r.state is State.DEAD})
        return len(gone)

    async def _sweep_dlq(self, ids: set[str]) -> None:
        """Take the DLQ copies of jobs that left the dead state out of the DLQ
        (a read of each DLQ on a channel of its own; the rest go back)."""
        if not ids:
            return
        link = await self._link()
        queues = {q[len(self.keys.dlq) :] for q in await self.state.kv_scan(self.keys.dlq)}
        conn = link.conn
        if conn is None:
            return
        try:
            ch = await conn.channel()
            try:
                for q in queues:
                    ok = await ch.queue_declare(self.names.dlq(q), passive=True)
                    for _ in range(int(ok.message_count or 0)):
                        m = await ch.basic_get(self.names.dlq(q), no_ack=False)
                        d = m.delivery
                        if not isinstance(d, spec.Basic.GetOk):
                            break
                        if (m.header.properties.message_id or "") in ids:
                            await ch.basic_ack(int(d.delivery_tag or 0))
            finally:
                await ch.close()  # unacked copies go back to their DLQ
        except AMQP_ERRORS as exc:
            log.warning("could not sweep the dead-letter queues: %r", exc)

    async def cancel(self, ids: Sequence[str]) -> list[str]:
        """Cancel in one ``kv_update``: a fetch of the same job either sees
        the cancel (and drops the copy) or leased it first (and the job is
        not cancellable), never both.

        Each cancelled record is written once, in that update, with its ttl:
        kept until its queued copy has come up and been dropped
        (``_outlive``; a second write after the update would bring back a
        record that a purge deleted in between).  The unique key a cancelled
        job still holds gets the same ttl in the same update (it blocks as
        long as the record is kept, as a finished job's does).  Which
        entries those are is in the records: an update that finds a
        cancellable job whose key's entry it did not read writes nothing
        and names the entries, and the next one reads them too (jobs
        without a key: one update)."""
        now = await self._now()
        k = self.keys
        wanted = list(dict.fromkeys(k.job + i for i in ids))
        known: frozenset[str] = frozenset()
        for _ in range(KEY_ROUNDS):

            def decide(
                got: dict[str, bytes], known: frozenset[str] = known
            ) -> tuple[dict[str, KvWrite], list[str] | frozenset[str]]:
                writes: dict[str, KvWrite] = {}
                done: list[str] = []
                missing: set[str] = set()
                for key in wanted:
                    raw = got.get(key)
                    if raw is None:
                        continue
                    rec = Record.load(raw)
                    if rec.shown_state(now) not in CANCELLABLE_STATES:
                        continue
                    kk = self._entry_of(rec)
                    if kk is not None and kk not in known:
                        missing.add(kk)
                        continue
                    rec.state, rec.updated_at = State.CANCELLED, now
                    rec.ver += 1  # its queued copy is stale now
                    ttl = self._outlive(rec, now)
                    writes[key] = (rec.dump(), ttl)
                    id_ = key[len(k.job) :]
                    if kk is not None and got.get(kk, b"").decode() == id_:
                        writes[kk] = (id_.encode(), ttl)
                    done.append(id_)
                if missing:
                    return {}, known | missing  # read those entries too, and decide again
                return writes, done

            out = await self.state.kv_update([*wanted, *sorted(known)], decide)
            if isinstance(out, list):
                return out
            known = out
        raise BrokerError("rabbitmq cancel: the jobs' unique keys kept changing")

    def _outlive(self, rec: Record, now: float) -> float:
        """Seconds a record or tombstone must stay so that the job's queued
        copy (due at ``run_at``) finds it: retention past the due time."""
        keep = self.event_retention if rec.msg.kind == EVENT else self.retention
        return max(keep, rec.run_at - now + keep)

    async def reschedule(self, ids: Sequence[str], at: float) -> list[str]:
        """Waiting jobs to run at ``at``: copies first, then the records in one
        ``_swap`` (see ``replay``).  A job a worker leased, or another call
        changed, between the read and the write is not rescheduled (and not
        returned); its new copy is stale, or parks behind the live lease
        (``_judge``) and is dropped once the job is done."""
        now = await self._now()
        at = self.clock.to_server(at)
        got = await self.state.kv_get([self.keys.job + i for i in ids])
        planned: dict[str, tuple[_Stamp, bytes]] = {}
        copies = []
        for i in ids:
            key = self.keys.job + i
            raw = got.get(key)
            if raw is None or key in planned:
                continue
            rec = Record.load(raw)
            if rec.shown_state(now) not in CANCELLABLE_STATES:
                continue
            before = _stamp(rec)
            rec.ver += 1
            rec.run_at, rec.updated_at = at, now
            rec.state = State.SCHEDULED if at > now else State.READY
            copies.append(self._copy(rec.msg, rec.ver, at))
            planned[key] = (before, rec.dump())
        if not planned:
            return []
        await self._send(copies, True)
        won = set(await self._swap(planned))
        return [key[len(self.keys.job) :] for key in planned if key in won]

    async def pause(self, queue: str) -> None:
        await self.state.kv_set({self.keys.paused + queue: b"1", self.keys.queue + queue: b"1"})
        link = self._links.get(asyncio.get_running_loop())
        if link is not None and link.ok():
            link.paused_until[queue] = self.clock.now() + 1.0
            for lq in self.names.lanes(queue):
                await link.cancel(lq)

    async def resume(self, queue: str) -> None:
        await self.state.kv_delete([self.keys.paused + queue])
        link = self._links.get(asyncio.get_running_loop())
        if link is not None:
            link.paused_until.pop(queue, None)
            link.looked_at = 0.0
            link.arrived.set()


def _parse(
    raws: list[Raw], lease_until: float
) -> tuple[list[tuple[Raw, Message, str, Message | None]], list[Delivery]]:
    """Decode copies: (raw, message, job id, the event if it is a fanned-out
    one), and deliveries of the undecodable ones for the worker to dead-letter."""
    parsed: list[tuple[Raw, Message, str, Message | None]] = []
    bad: list[Delivery] = []
    for raw in raws:
        try:
            m = decode(raw.body)
        except MessageDecodeError as exc:
            replayed = _text_header(raw, "dw-raw")
            bad.append(
                Delivery(
                    # the record of a dead letter a replay put back, or a new
                    # one's; never the AMQP message id, which may be a job's
                    # (a damaged copy of it) whose record must stay its own
                    id=replayed or uuid7(),
                    message=None,
                    token=Token(_ver_of(raw) if replayed else 0, raw.gen, raw.tag),
                    lease_until=lease_until,
                    queue=raw.queue,
                    raw=raw.body,
                    decode_error=str(exc),
                )
            )
            continue
        if m.kind == EVENT and not m.queue:  # a fanned-out event
            parsed.append((raw, m, delivery_id(m.id, raw.queue), m))
        else:
            parsed.append((raw, m, m.id, None))
    return parsed, bad


async def _after_send(write: Callable[..., Awaitable[T]], *args: Any) -> T:
    """``write(*args)`` once the event loop has had one turn.

    Started as a task right before the publish: the publish queues its
    frames for aiormq's writer task, which runs in the loop's next turn, and
    this task's first turn would come before it.  A state store that writes
    on the caller's thread (SQLite's quick path) would then hold the frames
    back for the length of its write; one turn later they are on the socket
    and the write overlaps the broker's confirm instead of preceding it."""
    await asyncio.sleep(0)
    return await write(*args)


def _unrecorded(raw: Raw, m: Message, ver: int, now: float) -> _Verdict:
    """``_judge`` of a copy without a record (nor a tombstone): its enqueue
    is between the publish and a failed compensation, or the state store
    lost it (a crash of a store that does not sync every commit).  Wait a
    moment for it; then the copy, which RabbitMQ confirmed, is the truth."""
    seen = _seen(raw, now)
    if now - seen < RECORD_GRACE:
        if _may_wait(raw, now):
            return _WAIT, None
        return _PARK, Record(msg=m, state=State.SCHEDULED, run_at=now + topo.UNIT)
    return _TAKE, Record(
        msg=m, state=State.READY, ver=ver, run_at=now, updated_at=now, enq=_enq_of(raw)
    )


def _ahead(raw: Raw, m: Message, rec: Record, ver: int, now: float) -> _Verdict | None:
    """``_judge`` of a copy newer than its record: a verdict, or None when the
    copy wins (``rec`` is then its job's record as the copy makes it).

    A copy sent before its record is written (the writer publishes first,
    so a crash in between loses nothing): wait for the record, whatever
    state it is in now (``replay`` publishes while the record still says
    dead; dropped as a dead job's, its copy left the replayed record ready
    with no copy to serve it).  If the record never comes, its writer died,
    and the copy wins over a waiting record or a dead one (the replay's),
    but never over a live lease or a finished job: an admin call or a
    rescue whose record write found the job leased since its read
    (``_swap``) leaves such a copy behind, and it waits the lease out (the
    job is then done, and the copy dropped; or retried, rescued or its
    lease lost, and the copy stale, a twin or the winner)."""
    seen = _seen(raw, now)
    if now - seen < RECORD_GRACE:
        if _may_wait(raw, now):
            return _WAIT, None
        rec.state, rec.run_at = State.SCHEDULED, now + topo.UNIT
        return _PARK, rec
    if rec.state in (State.SUCCEEDED, State.CANCELLED):
        return _DROP, None
    if rec.state is State.RUNNING and rec.lease_until > now:
        return _PARK, rec
    rec.ver, rec.msg = ver, m
    rec.state, rec.run_at = State.READY, now
    return None


#: what tells one record of a job from the next: its version (a new copy, a
#: cancel), its fencing token (a lease), its state (an ack) and its lease's
#: end (a heartbeat: a rescue of the lease it read must lose to it)
_Stamp = tuple[int, int, str, float]


def _stamp(rec: Record) -> _Stamp:
    return rec.ver, rec.token, rec.state.value, rec.lease_until


def _swapped(
    planned: Mapping[str, tuple[_Stamp, bytes]], got: Mapping[str, bytes]
) -> dict[str, bytes]:
    """The planned records (key: (the read record's stamp, the new record))
    whose stored record ``got`` still has the stamp read."""
    writes: dict[str, bytes] = {}
    for key, (old, new) in planned.items():
        raw = got.get(key)
        if raw is not None and _stamp_raw(raw) == old:
            writes[key] = new
    return writes


def _stamp_raw(raw: bytes) -> _Stamp:
    """``_stamp`` of a stored record without parsing its envelope."""
    d = orjson.loads(raw)
    return int(d["v"]), int(d["t"]), str(d["s"]), float(d.get("l") or 0.0)


def _lease_error(rec: Record, now: float, why: str) -> ErrorRecord:
    return ErrorRecord(
        time=now,
        type=f"dumbwaiter.errors.{LeaseExpired.__name__}",
        message=f"lease expired: worker {rec.worker or '?'} lost attempt {rec.msg.attempt} ({why})",
        worker=rec.worker or "",
        attempt=rec.msg.attempt,
    )


def state_url_option(state_url: str) -> str:
    """``state_url`` quoted for the ``state=`` option of an amqp:// URL."""
    return quote(state_url, safe="")
