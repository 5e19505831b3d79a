"""``redis://HOST:PORT/DB?prefix=NAME`` (and ``rediss://`` for TLS).

Every state transition is one Lua script (``scripts/*.lua``), so each is
atomic on the server and costs one round trip however many jobs it moves:
a worker claims a batch, acks a batch, extends every lease it holds, in one
call each.  Scripts are sent by SHA1 (``EVALSHA``) and re-sent in full only
when the server answers ``NOSCRIPT`` (after a restart or ``SCRIPT FLUSH``).

Keys: everything of one app lives under ``{dw:NAME}:`` (``docs/redis.md``
lists them).  The braces are a Redis Cluster hash tag: all of an app's keys
hash to one slot, so multi-key scripts are legal on a cluster, and the
broker follows ``MOVED`` to the node that owns the slot.

Idle workers block on the server: an idle fetch registers as a waiter of
its queues and waits in ``BLPOP`` on an inbox of its own (until the earliest
scheduled job is due, at most ``wait``).  The enqueue script hands ready jobs
straight into a waiter's inbox, already leased to it, so a job starts one
hop after its enqueue; other transitions that make jobs ready leave a
wake-up there instead.  Sync producers (``enqueue_sync``) use blocking
sockets of their own thread: no event loop, no thread hop.  Enqueue itself
(chunking, staging of big batches, retries) is in ``bulk.py``.

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

import asyncio
import hashlib
import logging
import secrets
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, ClassVar, TypeVar
from urllib.parse import urlencode, urlsplit, urlunsplit

import orjson
from redis.exceptions import RedisError, ResponseError

from ...errors import BrokerError, InvalidURL, MessageDecodeError
from ...message import ErrorRecord, Message
from ...message import from_dict as message_from_dict
from ...redact import mask_url
from ...state import State
from .. import failure, urlopts
from ..base import (
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
    kv_write,
    normalize_error_type,
)
from ..clock import ServerClock
from . import bulk, events, lua
from .client import PERMANENT, TRANSIENT, Arg, AsyncLink, SyncLink, Target

log = logging.getLogger("dumbwaiter.redis")
T = TypeVar("T")

#: finished jobs (without a longer-kept result) are deleted after this many seconds
DEFAULT_RETENTION = 3600.0
#: jobs moved or deleted per rescue call, and per call of a replay or purge
HOUSEKEEPING_CHUNK = 1000
#: jobs an admin walk looks at per call, at most (one call stays short)
WALK_BUDGET = 10_000
#: the same for a search by key, which reads each unheld job's body too
#: (about 7 us a job here): 2,000 keep one call near 15 ms
KEY_WALK_BUDGET = 2_000
#: seconds an idle fetch stays registered as a waiter before it registers again
WAITER_TTL = 1.0
#: rounds of read, decide and compare-and-set a ``kv_update`` tries before it
#: gives up (each lost round backs off 1 ms, doubling to 50 ms, jittered: a
#: few seconds in all, far more than any real contention needs)
KV_UPDATE_ATTEMPTS = 200
#: fields of a job as ``get`` and ``list`` read them
_INFO = (b"body", b"q", b"st", b"a", b"err", b"ra", b"u", b"w", b"lu", b"res", b"rp")


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


class RedisBroker(Broker):
    capabilities: ClassVar[Capabilities] = Capabilities(
        sync_enqueue=True, multi_process=True, multi_host=True, limits=True, events=True
    )
    schemes: ClassVar[tuple[str, ...]] = ("redis", "rediss")
    client_errors: ClassVar[tuple[type[BaseException], ...]] = (RedisError, OSError)

    def __init__(self, url: str) -> None:
        super().__init__(url)
        rest, opts = parse_url(url)
        name = opts[PREFIX] or "default"
        self.retention = opts[RETENTION]
        #: seconds an enqueue keeps trying while the server is unreachable
        self.reconnect = opts[RECONNECT]
        #: an enqueue returns only once this many replicas have its writes
        #: (``WAIT``), or fails after ``wait_timeout`` seconds
        self.wait_replicas = opts[WAIT_REPLICAS]
        self.wait_timeout = opts[WAIT_TIMEOUT]
        socket_timeout = opts[SOCKET_TIMEOUT]
        try:
            self._target = Target(rest, socket_timeout, opts[CONNECT_TIMEOUT])
        except ValueError as exc:  # redis-py's own reading of the URL
            raise InvalidURL(f"redis URL {mask_url(url)!r}: {exc}") from None
        self.socket_timeout = socket_timeout
        #: the hash tag every key of this app starts with
        self.prefix = f"{{dw:{name}}}"
        self._keys: tuple[Arg, ...] = (self.prefix,)
        self._lua = lua.scripts()
        self._links: dict[asyncio.AbstractEventLoop, AsyncLink] = {}
        self._last: AsyncLink | None = None
        self._sync: SyncLink | None = None
        #: the server's clock (``TIME``), which every time written here is on
        self.clock = ServerClock()

    def __repr__(self) -> str:
        return f"<RedisBroker {self.prefix}>"

    def failure(
        self, exc: BaseException, what: str = "", waited: float | None = None
    ) -> BrokerError:
        """``exc`` (redis-py's, or a socket's) as the ``BrokerError`` it means:
        refused credentials or a missing database number (for good), an
        unreachable or restarting server (for now), anything else."""
        if isinstance(exc, PERMANENT):
            return failure.refused(self.url, exc, auth=True)
        if isinstance(exc, ResponseError) and "DB index is out of range" in str(exc):
            return failure.refused(self.url, exc)
        if isinstance(exc, TRANSIENT):
            return failure.unavailable(self.url, exc, waited)
        return failure.failed(self.url, exc, f"redis {what}" if what else "redis")

    # -- connections -----------------------------------------------------------

    def _link(self) -> AsyncLink:
        """This event loop's connections (a broker may serve several loops)."""
        loop = asyncio.get_running_loop()
        link = self._last
        if link is not None and link.loop is loop:
            return link
        link = self._links.get(loop)
        if link is None:
            for old in [lk for lk in self._links.values() if lk.loop.is_closed()]:
                old.abandon()
                del self._links[old.loop]
            link = self._links[loop] = AsyncLink(self._target, loop)
        self._last = link
        return link

    def _sync_link(self) -> SyncLink:
        if self._sync is None:
            self._sync = SyncLink(self._target)
        return self._sync

    async def _now(self) -> float:
        """The server's time (``clock.py``): leases, expiries and run times
        compare on it, whatever this host's wall clock says."""
        await self.clock.sync(self._server_time)
        return self.clock.now()

    async def server_time(self) -> float | None:
        return await self._server_time()

    async def _server_time(self) -> float:
        try:
            sec, usec = await self._link().call(b"TIME")
        except RedisError as exc:
            raise self.failure(exc, "time") from exc
        return int(sec) + int(usec) / 1e6

    def _server_time_sync(self) -> float:
        try:
            sec, usec = self._sync_link().call(b"TIME")
        except RedisError as exc:
            raise self.failure(exc, "time") from exc
        return int(sec) + int(usec) / 1e6

    async def _run(self, script: lua.Script, args: Sequence[Arg]) -> Any:
        try:
            return await self._link().script(script, self._keys, args)
        except RedisError as exc:
            raise self.failure(exc, script.name) from exc

    # -- transport -------------------------------------------------------

    async def open(self) -> None:
        self._link()

    async def close(self) -> None:
        try:
            current: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            current = None
        links, self._links, self._last = self._links, {}, None
        for loop, link in links.items():
            if loop is current:
                await link.aclose()
            elif loop.is_closed():
                link.abandon()
            elif loop.is_running():
                asyncio.run_coroutine_threadsafe(link.aclose(), loop)
        if self._sync is not None:
            self._sync.close()
            self._sync = None

    async def declare(self, queues: Sequence[str], bindings: Sequence[Binding] = ()) -> None:
        if queues or bindings:
            args: list[Arg] = [len(queues), *queues]
            for b in bindings:
                args += (b.pattern, b.queue, b.max_attempts)
            await self._run(self._lua.declare, args)

    # -- events (events.py, scripts/_events.lua) --------------------------------

    async def publish(self, msgs: Iterable[Message]) -> int:
        await self.clock.sync(self._server_time)
        return await events.publish_async(self, msgs)

    def publish_sync(self, msgs: Iterable[Message]) -> int:
        self.clock.sync_blocking(self._server_time_sync)
        return events.publish_sync(self, msgs)

    async def list_events(
        self,
        event_type: str,
        since: float | None = None,
        until: float | None = None,
        cursor: str | None = None,
        limit: int = 500,
    ) -> tuple[list[Message], str | None]:
        args = events.list_args(event_type, since, until, cursor, limit)
        return events.parse_page(await self._run(self._lua.list_events, args))

    async def enqueue(self, msgs: Iterable[Message]) -> list[str]:
        await self.clock.sync(self._server_time)
        if type(msgs) is list and len(msgs) == 1 and not self.wait_replicas:
            return [await bulk.enqueue_one_async(self, self._link(), msgs[0])]
        return await bulk.drive_async(self._link(), bulk.Enqueue(self, msgs).plan())

    def enqueue_sync(self, msgs: Iterable[Message]) -> list[str]:
        self.clock.sync_blocking(self._server_time_sync)
        if type(msgs) is list and len(msgs) == 1 and not self.wait_replicas:
            return [bulk.enqueue_one_sync(self, self._sync_link(), msgs[0])]
        return bulk.drive_sync(self._sync_link(), bulk.Enqueue(self, msgs).plan())

    async def fetch(
        self, queues: Sequence[str], limit: int, lease: float, wait: float, worker: str = ""
    ) -> list[Delivery]:
        if limit <= 0 or not queues:
            return []
        if wait <= 0:
            once = asyncio.ensure_future(self._claim(queues, limit, lease, worker, "", None))
            try:
                return (await asyncio.shield(once))[0]
            except asyncio.CancelledError:
                await asyncio.shield(self._give_back(once, queues, ""))
                raise
        # Nothing ready: register as a waiter of the queues and wait in BLPOP
        # on our own inbox.  An enqueue hands ready jobs straight into it,
        # already leased to us (no second round trip); other changes (a
        # retry, a rescue, a resume) leave a wake-up there and we claim.  The
        # registration lapses after WAITER_TTL, so a worker that died while
        # waiting is soon skipped: each round registers again.
        wid = secrets.token_hex(8)
        inbox = f"{self.prefix}:in:{wid}"
        deadline = time.monotonic() + wait
        claim: asyncio.Future[tuple[list[Delivery], float | None]] | None = None
        try:
            while True:
                remaining = deadline - time.monotonic()
                now = await self._now()
                until = now + min(remaining, WAITER_TTL) + 0.5 if remaining > 0 else None
                claim = asyncio.ensure_future(self._claim(queues, limit, lease, worker, wid, until))
                out, next_due = await asyncio.shield(claim)
                claim = None
                if out or until is None:
                    return out
                block = min(remaining, WAITER_TTL)
                if next_due is not None:
                    block = min(block, next_due - (await self._now()))
                if block <= 0:
                    continue
                # BLPOP's timeout 0 means "for ever": never round down to it
                try:
                    item = await self._link().call(
                        b"BLPOP",
                        inbox,
                        f"{max(block, 0.001):.3f}",
                        timeout=block + self.socket_timeout,
                    )
                except RedisError as exc:
                    raise self.failure(exc, "fetch") from exc
                if item is not None and item[1] != b"w":
                    return _handed(item[1])
        except BaseException:
            # cancelled (the worker stops) or the server went away: withdraw
            # the registration, and give back what was handed to us meanwhile
            await asyncio.shield(self._give_back(claim, queues, wid))
            raise

    async def _give_back(
        self,
        claim: asyncio.Future[tuple[list[Delivery], float | None]] | None,
        queues: Sequence[str],
        wid: str,
    ) -> None:
        """After a fetch was cancelled: withdraw its waiter and give back,
        uncharged, whatever it was handed or had claimed meanwhile."""
        ds: list[Delivery] = []
        try:
            if claim is not None:
                ds += (await claim)[0]
            if wid:
                ds += (await self._claim(queues, 0, 0.0, "", wid, None))[0]
            await self.requeue(ds)
        except Exception as exc:
            # the server is gone: these leases run out and the rescuer gives
            # the jobs back (uncharged, if they never left the inbox)
            if ds:
                log.warning("could not give back %d job(s) of a fetch: %s", len(ds), exc)

    async def _claim(
        self,
        queues: Sequence[str],
        limit: int,
        lease: float,
        worker: str,
        wid: str,
        register_until: float | None,
    ) -> tuple[list[Delivery], float | None]:
        """One fetch script call: the waiter's inbox, then ready jobs."""
        now = await self._now()
        args: list[Arg] = [
            repr(now),
            limit,
            repr(lease),
            worker,
            wid,
            "" if register_until is None else repr(register_until),
            *queues,
        ]
        r = await self._run(self._lua.fetch, args)
        token = int(r[0])
        n_items = int(r[2])
        out: list[Delivery] = []
        for item in r[3 : 3 + n_items]:
            if item != b"w":
                out += _handed(item)
        first = 3 + n_items
        if len(r) > first:
            until = now + lease
            out += [_delivery(r, i, token, until) for i in range(first, len(r), 5)]
        if out:
            return out, None
        return out, float(r[1]) if r[1] else None

    async def ack(self, ds: Sequence[Delivery]) -> None:
        if not ds:
            return
        now = await self._now()
        retention = self.retention
        args: list[Arg] = [repr(now)]
        for d in ds:
            keep = max(retention, d.result_ttl or 0.0) if d.result is not None else retention
            args += (d.id, d.token, repr(now + keep), d.result if d.result is not None else b"")
        await self._run(self._lua.ack, args)

    async def retry(self, ds: Sequence[Delivery]) -> None:
        if not ds:
            return
        args: list[Arg] = [repr(await self._now())]
        for d in ds:
            err, etype = _error(d.error)
            args += (d.id, d.token, repr(self.clock.to_server(d.retry_at)), err, etype)
        await self._run(self._lua.retry, args)

    async def dead(self, ds: Sequence[Delivery]) -> None:
        if not ds:
            return
        args: list[Arg] = [repr(await self._now())]
        for d in ds:
            err, etype = _error(d.error)
            args += (d.id, d.token, err, etype)
        await self._run(self._lua.dead, args)

    async def requeue(self, ds: Sequence[Delivery]) -> None:
        if not ds:
            return
        args: list[Arg] = [repr(await self._now())]
        for d in ds:
            args += (d.id, d.token, repr(self.clock.to_server(d.retry_at)))
        await self._run(self._lua.requeue, args)

    async def extend(self, ds: Sequence[Delivery], lease: float) -> list[Delivery]:
        if not ds:
            return []
        until = (await self._now()) + lease
        args: list[Arg] = [repr(until)]
        for d in ds:
            args += (d.id, d.token)
        lost_at = {int(i) for i in await self._run(self._lua.extend, args)}
        lost = []
        for i, d in enumerate(ds, 1):
            if i in lost_at:
                lost.append(d)
            else:
                d.lease_until = until
        return lost

    async def rescue(self) -> Rescued:
        # Each call handles at most HOUSEKEEPING_CHUNK expired leases and as
        # many finished jobs past their retention, so the server is never held
        # for long; a busy app (more jobs finishing per second than one call
        # prunes) gets as many calls as it needs, for up to half a second.
        rescued = 0
        dead: list[DeadLetter] = []
        stop = time.monotonic() + 0.5
        while True:
            now = await self._now()
            args: list[Arg] = [repr(now), HOUSEKEEPING_CHUNK, repr(now - self.event_retention)]
            n, more, buried = await self._run(self._lua.rescue, args)
            rescued += int(n)
            # id, queue, name, error record (JSON), attempt, body, errors (JSON)
            for i in range(0, len(buried), 7):
                id_, queue, name, err, attempt, body, errors = buried[i : i + 7]
                error = ErrorRecord.from_dict(orjson.loads(err))
                try:
                    msg: Message | None = _message(body, queue.decode(), int(attempt), errors)
                except (orjson.JSONDecodeError, MessageDecodeError):
                    msg = None
                dead.append(DeadLetter(id_.decode(), queue.decode(), name.decode(), error, msg))
            if not more or time.monotonic() > stop:
                return Rescued(rescued, dead)

    # -- admin -----------------------------------------------------------

    async def stats(self) -> list[QueueStats]:
        now = await self._now()
        r = await self._run(self._lua.stats, [repr(now)])
        out = []
        for i in range(0, len(r), 10):
            q, ready, sched, retrying, running, dead, ok, cancelled, paused, oldest = r[i : i + 10]
            retrying = int(retrying)
            out.append(
                QueueStats(
                    queue=q.decode(),
                    ready=int(ready),
                    scheduled=int(sched) - retrying,
                    retrying=retrying,
                    running=int(running),
                    dead=int(dead),
                    succeeded=int(ok),
                    cancelled=int(cancelled),
                    lag=max(0.0, now - int(oldest) / 1e6) if oldest else 0.0,
                    paused=bool(int(paused)),
                )
            )
        return out

    def _walk_args(self, f: JobFilter, index: str, cursor: str | None, limit: int) -> list[Arg]:
        args: list[Arg] = [
            repr(self.clock.now()),
            cursor or "",
            limit,
            WALK_BUDGET if f.key is None else KEY_WALK_BUDGET,
            f.queue or "",
            f.name or "",
            str(f.state) if f.state is not None else "",
            normalize_error_type(f.error_type) if f.error_type is not None else "",
            repr(self.clock.to_server(f.since)) if f.since is not None else "",
            repr(self.clock.to_server(f.until)) if f.until is not None else "",
            f.key if f.key is not None else "",
        ]
        if f.ids is not None:
            ids = sorted(set(f.ids), reverse=True)
            if cursor:
                ids = [i for i in ids if i < cursor]
            return [*args, "given", *ids]
        return [*args, index]

    async def list_jobs(
        self, filter: JobFilter, cursor: str | None = None, limit: int = 50
    ) -> Page:
        if filter.ids is not None and not filter.ids:
            return Page()
        index = "dead" if filter.state is State.DEAD else "ids"
        items: list[JobInfo] = []
        await self.clock.sync(self._server_time)  # for _walk_args
        while True:
            args = self._walk_args(filter, index, cursor, limit - len(items))
            r = await self._run(self._lua.list, args)
            items += [_info(r[i], r[i + 1 : i + 12]) for i in range(1, len(r), 12)]
            cursor = r[0].decode() or None
            # A key search reads bodies and matches few jobs, so one call's
            # budget (KEY_WALK_BUDGET jobs) may end with an empty page and a
            # cursor: go on, one bounded call at a time, until the page is
            # full or the index is exhausted, so a search over many jobs
            # answers in one page instead of a trail of empty ones.
            if filter.key is None or cursor is None or len(items) >= limit:
                return Page(items=items, cursor=cursor)

    async def get(self, id: str) -> JobInfo | None:
        try:
            v = await self._link().call(b"HMGET", f"{self.prefix}:job:{id}", *_INFO)
        except RedisError as exc:
            raise self.failure(exc, "get") from exc
        if v[2] is None or v[2] == b"staged":  # staged: not enqueued yet (see bulk.py)
            return None
        return _info(id.encode(), v)

    async def _walk(self, script: lua.Script, f: JobFilter, index: str) -> int:
        """Run replay or purge over every match, one bounded call at a time."""
        await self.clock.sync(self._server_time)  # for _walk_args
        if f.ids is not None:
            ids = sorted(set(f.ids), reverse=True)
            n = 0
            for i in range(0, len(ids), HOUSEKEEPING_CHUNK):
                part = JobFilter(**{**_fields(f), "ids": tuple(ids[i : i + HOUSEKEEPING_CHUNK])})
                args = self._walk_args(part, index, None, HOUSEKEEPING_CHUNK)
                n += int((await self._run(script, args))[1])
            return n
        cursor: str | None = None
        n = 0
        while True:
            r = await self._run(script, self._walk_args(f, index, cursor, HOUSEKEEPING_CHUNK))
            n += int(r[1])
            cursor = r[0].decode() or None
            if cursor is None:
                return n

    async def replay(self, filter: JobFilter) -> int:
        if filter.state is not None and filter.state is not State.DEAD:
            return 0
        return await self._walk(self._lua.replay, filter, "dead")

    async def purge(self, filter: JobFilter) -> int:
        index = "dead" if filter.state is State.DEAD else "ids"
        return await self._walk(self._lua.purge, filter, index)

    async def cancel(self, ids: Sequence[str]) -> list[str]:
        if not ids:
            return []
        now = await self._now()
        r = await self._run(self._lua.cancel, [repr(now), repr(now + self.retention), *ids])
        return [i.decode() for i in r]

    async def reschedule(self, ids: Sequence[str], at: float) -> list[str]:
        if not ids:
            return []
        now = await self._now()
        at = self.clock.to_server(at)
        r = await self._run(self._lua.reschedule, [repr(now), repr(at), *ids])
        return [i.decode() for i in r]

    async def pause(self, queue: str) -> None:
        await self._run(self._lua.pause, [repr(await self._now()), queue, b"1"])

    async def resume(self, queue: str) -> None:
        await self._run(self._lua.pause, [repr(await self._now()), queue, b"0"])

    # -- coordination ------------------------------------------------------

    async def acquire(self, name: str, owner: str, ttl: float) -> int | None:
        now = await self._now()
        r = await self._run(self._lua.acquire, [name, owner, repr(now), repr(now + ttl)])
        return None if r is None else int(r)

    async def renew(self, name: str, owner: str, token: int, ttl: float) -> bool:
        now = await self._now()
        args: list[Arg] = [name, owner, token, repr(now), repr(now + ttl)]
        return bool(await self._run(self._lua.renew, args))

    async def release(self, name: str, owner: str, token: int) -> None:
        await self._run(self._lua.release, [name, owner, token])

    # -- key-value ---------------------------------------------------------------

    async def kv_get(self, keys: Sequence[str]) -> dict[str, bytes]:
        keys = list(keys)
        if not keys:
            return {}
        r = await self._run(self._lua.kv_get, [repr(await self._now()), *keys])
        return {k: v for k, v in zip(keys, r, strict=True) if v is not None}

    async def kv_set(self, items: Mapping[str, bytes], ttl: float | None = None) -> None:
        if not items:
            return
        args: list[Arg] = ["" if ttl is None else repr((await self._now()) + ttl)]
        for k, v in items.items():
            args += (k, bytes(v))
        await self._run(self._lua.kv_set, args)

    async def kv_update(
        self,
        keys: Sequence[str],
        decide: Callable[[dict[str, bytes]], tuple[Mapping[str, KvWrite], T]],
    ) -> T:
        """Optimistic and atomic: read the keys, ``decide``, then one script
        (``kv_cas.lua``) writes only if every key read still holds the value
        read (or is still absent); otherwise read and decide again.

        Why not WATCH/MULTI: every kv entry is a field of one hash (``kv``),
        and WATCH sees keys, not fields, so any kv write of the app (another
        job's record, a chord counter) would abort the transaction; the
        script compares exactly the keys read, and is as atomic (a script
        runs alone on the server, and every kv write is a script).  It also
        needs no connection of its own, and it is legal on a cluster: every
        kv key is a field under the app's hash tag.

        Read values travel back as SHA1 digests, so a big value costs its
        bytes once.  A write's ttl becomes its expiry time in ``kvx``, as
        ``kv_set`` stores it (on the server's clock, ``clock.py``, like every kv expiry
        here); a write without one clears any expiry the key had.
        """
        keys = list(dict.fromkeys(keys))
        delay = 0.001
        for _ in range(KV_UPDATE_ATTEMPTS):
            got = await self.kv_get(keys)  # one script: a consistent read
            writes, out = decide(dict(got))
            if not writes:
                return out
            args: list[Arg] = [repr(await self._now()), len(keys)]
            for k in keys:
                v = got.get(k)
                args += (k, "" if v is None else hashlib.sha1(v).hexdigest())
            at = await self._now()
            for k, w in writes.items():
                data, ttl = kv_write(w)
                args += (k, data, "" if ttl is None else repr(at + ttl))
            if int(await self._run(self._lua.kv_cas, args)):
                return out
            # another writer changed a key between our read and our write
            await asyncio.sleep(delay * (0.5 + secrets.randbelow(1000) / 1000))
            delay = min(delay * 2, 0.05)
        raise BrokerError(
            f"redis kv_update: the keys kept changing under {KV_UPDATE_ATTEMPTS} attempts"
            f" (first keys: {keys[:3]!r}); gave up"
        )

    async def kv_add(self, key: str, value: bytes, ttl: float | None = None) -> bool:
        now = await self._now()
        expires = "" if ttl is None else repr(now + ttl)
        return bool(await self._run(self._lua.kv_add, [repr(now), key, bytes(value), expires]))

    async def kv_incr(self, key: str, amount: int = 1, ttl: float | None = None) -> int:
        now = await self._now()
        expires = "" if ttl is None else repr(now + ttl)
        return int(await self._run(self._lua.kv_incr, [repr(now), key, amount, expires]))

    async def kv_delete(self, keys: Sequence[str]) -> int:
        if not keys:
            return 0
        return int(await self._run(self._lua.kv_delete, [repr(await self._now()), *keys]))

    async def kv_scan(self, prefix: str) -> dict[str, bytes]:
        r = await self._run(self._lua.kv_scan, [repr(await self._now()), prefix])
        return {r[i].decode(): r[i + 1] for i in range(0, len(r), 2)}

    # -- flow control ------------------------------------------------------------

    async def rate_limit(self, key: str, rate: int, per: float, at: float) -> float:
        await self.clock.sync(self._server_time)
        at = self.clock.to_server(at)
        args: list[Arg] = [key, rate, repr(per), repr(at), repr(at - per), repr(at + per)]
        args += (repr(at - 2 * per), f"{at!r}:{secrets.token_hex(6)}")
        return float(await self._run(self._lua.rate_limit, args))

    async def slot_acquire(self, key: str, limit: int, holder: str, ttl: float) -> bool:
        now = await self._now()
        args: list[Arg] = [b"acquire", key, limit, holder, repr(now), repr(now + ttl)]
        return bool(await self._run(self._lua.slots, args))

    async def slot_extend(self, holds: Sequence[tuple[str, str]], ttl: float) -> None:
        if holds:
            args: list[Arg] = [b"extend", repr((await self._now()) + ttl)]
            await self._run(self._lua.slots, args + [x for h in holds for x in h])

    async def slot_release(self, holds: Sequence[tuple[str, str]]) -> None:
        if holds:
            await self._run(self._lua.slots, [b"release", *(x for h in holds for x in h)])


# -- replies -------------------------------------------------------------------


def _error(e: ErrorRecord | None) -> tuple[bytes, str]:
    if e is None:
        return b"", ""
    return orjson.dumps(e.to_dict()), e.type


def _fields(f: JobFilter) -> dict[str, Any]:
    return {
        "queue": f.queue,
        "name": f.name,
        "state": f.state,
        "error_type": f.error_type,
        "since": f.since,
        "until": f.until,
        "ids": f.ids,
        "key": f.key,
    }


def _message(body: bytes, queue: str, attempt: int, errors: bytes | None) -> Message:
    d = orjson.loads(body)
    if not isinstance(d, dict):
        raise MessageDecodeError(f"message body is a JSON {type(d).__name__}, not an object")
    d["queue"] = queue
    d["attempt"] = attempt
    d["errors"] = orjson.loads(errors) if errors else []
    return message_from_dict(d)


def _handed(item: bytes) -> list[Delivery]:
    """The deliveries an enqueue put in a waiter's inbox (see enqueue.lua)."""
    return [
        _delivery([i.encode(), q.encode(), a, body.encode(), err.encode()], 0, int(tk), float(lu))
        for i, q, a, body, err, tk, lu in orjson.loads(item)
    ]


def _delivery(r: list[Any], i: int, token: int, until: float) -> Delivery:
    id_, q, attempt, body, errors = r[i : i + 5]
    queue = q.decode()
    try:
        msg: Message | None = _message(body, queue, attempt, errors)
        problem = None
    except (orjson.JSONDecodeError, MessageDecodeError) as exc:
        msg, problem = None, str(exc)
    return Delivery(
        id=id_.decode(),
        message=msg,
        token=token,
        lease_until=until,
        queue=queue,
        raw=None if msg is not None else body,
        decode_error=problem,
    )


def _opt_float(v: bytes | None) -> float | None:
    return float(v) if v else None


def _info(id_: bytes, v: Sequence[Any]) -> JobInfo:
    body, q, st, a, err, ra, u, w, lu, res, rp = v
    queue, attempt = q.decode(), int(a or 0)
    raw = None
    try:
        msg = _message(body, queue, attempt, err or None)
    except (orjson.JSONDecodeError, MessageDecodeError):
        # keep what the job's fields say, so a dead letter shows why it died
        raw = body
        msg = Message(
            id=id_.decode(),
            kind="task",
            name="?",
            queue=queue,
            attempt=attempt,
            errors=[ErrorRecord.from_dict(e) for e in orjson.loads(err)] if err else [],
        )
    state = State(st.decode())
    if state is State.SCHEDULED and attempt > 0:
        state = State.RETRYING
    return JobInfo(
        message=msg,
        state=state,
        run_at=_opt_float(ra),
        updated_at=_opt_float(u),
        worker=w.decode() if w else None,
        lease_until=_opt_float(lu),
        result=res or None,
        replays=int(rp or 0),
        raw=raw,
    )
