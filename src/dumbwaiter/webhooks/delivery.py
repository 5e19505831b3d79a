"""One delivery attempt: the job that POSTs a signed webhook to an endpoint.

A delivery is a job of the task ``dumbwaiter.webhooks.deliver`` whose
arguments are the endpoint's id, the ``webhook-id`` (fixed when the delivery
is made, so every retry, redelivery after a crash and replay carries the
same one and the receiver can de-duplicate), the event type, its data and
when it happened.  Each attempt:

1. reads the endpoint and its breaker in one ``kv_get``: a removed or
   disabled endpoint dead-letters the delivery with the reason (replay it
   once the endpoint is enabled); an open breaker defers it (below);
2. signs the body with a fresh ``webhook-timestamp`` (receivers reject old
   ones) and POSTs it through the worker loop's pooled client, whose
   connections pass the SSRF guard;
3. records the attempt (status, latency, the first KB of the answer) and
   settles it: 2xx succeeds; 410 Gone disables the endpoint and
   dead-letters; 429, or 503 with ``Retry-After``, retries after the time
   the receiver asked for (``RetryLater``, one attempt used); anything else
   fails and is retried on the schedule (the task's ``Retry``), then
   dead-lettered with the last status and answer.

A delivery the breaker defers does not use up an attempt: it is handed on
to a *continuation*, the same job (arguments, headers, attempt count, error
history) under a new id, due at the end of the cool-down, and this run ends.
Its id is derived from this job's id and attempt, so a crash between the
two steps makes the same continuation again, which the broker stores once.
"""

from __future__ import annotations

import asyncio
import email.utils
import hashlib
import logging
import time
import weakref
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Protocol, cast

import httpx
import orjson

from ..errors import DumbwaiterError
from ..redact import mask_url
from ..retry import Reject, RetryLater
from ..version import __version__
from . import breaker
from .attempts import Attempt, AttemptLog, excerpt
from .endpoints import Endpoint
from .endpoints import key_of as endpoint_key
from .signing import sign
from .ssrf import AddressPolicy, GuardedTransport, UnsafeTarget

if TYPE_CHECKING:
    from ..brokers.base import Broker
    from ..context import Context
    from ..message import Message
    from ..ports import Runtime
    from .endpoints import Registry
    from .settings import Settings

log = logging.getLogger("dumbwaiter.webhooks")

TASK_NAME = "dumbwaiter.webhooks.deliver"
USER_AGENT = f"dumbwaiter-webhooks/{__version__}"
#: the longest ``Retry-After`` honoured (seconds); a longer one is cut to this
MAX_RETRY_AFTER = 86400.0


class DeliveryFailed(DumbwaiterError):
    """An attempt failed: a non-2xx answer, or no answer (the message says which)."""


class Owner(Protocol):
    """The ``app.webhooks`` a deliverer works for (``service.Webhooks``)."""

    @property
    def settings(self) -> Settings: ...

    @property
    def registry(self) -> Registry: ...

    @property
    def deliverer(self) -> Deliverer: ...

    def remember(self, ep: Endpoint) -> None: ...


class _WithWebhooks(Protocol):
    @property
    def webhooks(self) -> Owner: ...


def webhooks_of(app: Runtime) -> Owner:
    """The app's ``webhooks``: a job's context knows its app as a ``Runtime``
    only (the webhooks' own tasks run on an app that has them)."""
    return cast("_WithWebhooks", app).webhooks


async def deliver(
    endpoint_id: str,
    webhook_id: str,
    event_type: str,
    data: Any,
    occurred_at: str,
    ctx: Context,
) -> dict[str, Any]:
    """The delivery task: one attempt of one webhook (see the module's docstring)."""
    hooks = webhooks_of(ctx.app)
    return await hooks.deliverer.attempt(
        ctx, endpoint_id, webhook_id, event_type, data, occurred_at
    )


def body_of(event_type: str, data: Any, occurred_at: str) -> bytes:
    """The JSON body (the specification's ``{type, timestamp, data}``), the
    same bytes on every attempt."""
    return orjson.dumps({"type": event_type, "timestamp": occurred_at, "data": data})


def retry_after(value: str | None, now: float) -> float | None:
    """Seconds from ``now`` a ``Retry-After`` header asks for (delta seconds or an
    HTTP date), capped at ``MAX_RETRY_AFTER``; None when absent or unreadable."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return min(float(value), MAX_RETRY_AFTER)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return min(max(0.0, when.timestamp() - now), MAX_RETRY_AFTER)


def derived_id(seed: str, at: float) -> str:
    """A UUIDv7-shaped id made from ``seed`` (same seed, same id) whose time
    part is ``at``, so listings ordered by id stay ordered by time."""
    ms = int(at * 1000) & ((1 << 48) - 1)
    h = int.from_bytes(hashlib.blake2b(seed.encode(), digest_size=10).digest(), "big")
    rand_a = (h >> 68) & 0xFFF
    rand_b = h & ((1 << 62) - 1)
    n = (ms << 80) | (0x7 << 76) | (rand_a << 64) | (0b10 << 62) | rand_b
    x = f"{n:032x}"
    return f"{x[:8]}-{x[8:12]}-{x[12:16]}-{x[16:20]}-{x[20:]}"


def iso(t: float) -> str:
    return datetime.fromtimestamp(t, tz=UTC).isoformat().replace("+00:00", "Z")


class Deliverer:
    """Runs attempts for one app's webhooks; holds one pooled client per event loop."""

    def __init__(self, hooks: Owner) -> None:
        self.hooks = hooks
        self._clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, httpx.AsyncClient] = (
            weakref.WeakKeyDictionary()
        )

    @property
    def settings(self) -> Settings:
        return self.hooks.settings

    # -- the client ----------------------------------------------------------

    def client(self) -> httpx.AsyncClient:
        """This event loop's client: connections are pooled per loop (a
        worker has one), and a loop's connections cannot serve another."""
        loop = asyncio.get_running_loop()
        c = self._clients.get(loop)
        if c is None or c.is_closed:
            s = self.settings
            c = httpx.AsyncClient(
                transport=GuardedTransport(
                    AddressPolicy.make(s.allow_private, s.allow),
                    max_connections=s.max_connections,
                ),
                timeout=httpx.Timeout(s.timeout, connect=s.connect_timeout),
                follow_redirects=False,  # a 3xx is a failure (the specification)
                trust_env=False,  # no proxy from the environment: it would skip the guard
                headers={"user-agent": USER_AGENT},
            )
            self._clients[loop] = c
        return c

    async def aclose(self) -> None:
        """Close this loop's client (the others belong to loops of their own)."""
        loop = asyncio.get_running_loop()
        c = self._clients.pop(loop, None)
        if c is not None:
            await c.aclose()

    def reset(self) -> None:
        """Forget the clients (settings changed): new ones are made on next use."""
        self._clients = weakref.WeakKeyDictionary()

    # -- one attempt -----------------------------------------------------------

    async def attempt(
        self,
        ctx: Context,
        endpoint_id: str,
        webhook_id: str,
        event_type: str,
        data: Any,
        occurred_at: str,
    ) -> dict[str, Any]:
        broker = ctx.app.broker
        msg = ctx.message
        bkey = breaker.key_of(endpoint_id)
        ekey = endpoint_key(endpoint_id)
        got = await broker.kv_get([ekey, bkey])
        raw = got.get(ekey)
        log_ = AttemptLog(broker)
        if raw is None:
            raise Reject(f"webhook endpoint {endpoint_id!r} is not registered (removed?)")
        ep = Endpoint.decode(raw)
        self.hooks.remember(ep)
        if ep.disabled:
            await log_.keep(endpoint_id, webhook_id, None)
            raise Reject(
                f"webhook endpoint {endpoint_id!r} is disabled "
                f"({ep.disabled_reason or 'no reason'}); enable it and replay this delivery"
            )
        state = breaker.load(got.get(bkey))
        if state.get("state", breaker.CLOSED) != breaker.CLOSED:
            until = await self._admit(broker, bkey, msg.id)
            if until:
                return await self._defer(ctx, log_, ep, webhook_id, until)
        return await self._send(
            ctx, log_, ep, webhook_id, body_of(event_type, data, occurred_at), state
        )

    async def _admit(self, broker: Broker, key: str, job_id: str) -> float:
        policy = self.settings.breaker
        now = time.time()

        def decide(got: dict[str, bytes]) -> tuple[dict[str, bytes], float]:
            new, until = breaker.admit(breaker.load(got.get(key)), now, job_id, policy)
            return ({key: breaker.dump(new)} if new is not None else {}), until

        return await broker.kv_update([key], decide)

    async def _record_breaker(
        self, broker: Broker, key: str, ok: bool, seen: dict[str, Any]
    ) -> None:
        policy = self.settings.breaker
        now = time.time()
        if ok and breaker.record(seen, now, ok, policy) is None:
            return  # closed with no failures: nothing to write (the usual case)

        def decide(got: dict[str, bytes]) -> tuple[dict[str, bytes], None]:
            new = breaker.record(breaker.load(got.get(key)), now, ok, policy)
            if new is not None and new.get("state") == breaker.OPEN and new.get("opened_at") == now:
                log.warning("webhook endpoint %s: circuit breaker open", key[len(breaker.PREFIX) :])
            return ({key: breaker.dump(new)} if new is not None else {}), None

        await broker.kv_update([key], decide)

    async def _defer(
        self, ctx: Context, log_: AttemptLog, ep: Endpoint, webhook_id: str, until: float
    ) -> dict[str, Any]:
        """Hand the delivery on to a continuation due at ``until`` (nothing sent,
        no attempt used): see the module's docstring."""
        m = ctx.message
        cont = continuation(m, until)
        await ctx.app.broker.enqueue([cont])
        await log_.add(
            Attempt(
                at=time.time(),
                endpoint=ep.id,
                webhook_id=webhook_id,
                job_id=m.id,
                attempt=attempt_number(m),
                outcome="deferred",
                error=f"circuit breaker open: deferred to {iso(until)} as job {cont.id}",
            ),
            ttl=self.settings.retention,
        )
        return {"deferred_to": cont.id, "until": until}

    async def _send(
        self,
        ctx: Context,
        log_: AttemptLog,
        ep: Endpoint,
        webhook_id: str,
        body: bytes,
        seen: dict[str, Any],
    ) -> dict[str, Any]:
        s = self.settings
        m = ctx.message
        broker = ctx.app.broker
        bkey = breaker.key_of(ep.id)
        ts = int(time.time())
        headers = {
            "webhook-id": webhook_id,
            "webhook-timestamp": str(ts),
            "webhook-signature": sign(ep.signing_secrets(), webhook_id, ts, body),
            "content-type": "application/json",
        }
        started = time.monotonic()
        status: int | None = None
        answer = b""
        after: float | None = None

        async def record(outcome: str, error: str = "") -> None:
            await log_.add(
                Attempt(
                    at=time.time(),
                    endpoint=ep.id,
                    webhook_id=webhook_id,
                    job_id=m.id,
                    attempt=attempt_number(m),
                    outcome=outcome,
                    status=status,
                    latency_ms=round((time.monotonic() - started) * 1000, 3),
                    response=excerpt(answer),
                    error=error,
                ),
                ttl=s.retention,
            )

        try:
            async with self.client().stream("POST", ep.url, content=body, headers=headers) as r:
                status = r.status_code
                async for chunk in r.aiter_bytes():
                    answer += chunk
                    if len(answer) >= 1024:
                        break
                after = retry_after(r.headers.get("retry-after"), time.time())
        except UnsafeTarget as exc:
            await record("refused", str(exc))
            await self._dying(log_, ep.id, webhook_id)
            raise Reject(str(exc)) from None
        except (httpx.HTTPError, OSError) as exc:
            why = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
            await record("failed", why)
            await self._record_breaker(broker, bkey, False, seen)
            await self._if_last(ctx, log_, ep.id, webhook_id)
            raise DeliveryFailed(f"no answer from {mask_url(ep.url, path=True)}: {why}") from exc
        if 200 <= status < 300:
            await record("delivered")
            await self._record_breaker(broker, bkey, True, seen)
            if m.attempt > 1 or m.errors:  # entries a death made permanent expire again
                await log_.keep(ep.id, webhook_id, s.retention)
            return {"status": status, "endpoint": ep.id, "webhook_id": webhook_id}
        text = excerpt(answer)[:200]
        # a 5xx counts against the breaker; a 3xx or 4xx comes from a partner
        # that is up, so it resets the count, and a probe answered so closes
        # the breaker (else it would stay half-open until the probe's timeout)
        await self._record_breaker(broker, bkey, status < 500, seen)
        if status == 410:
            await record("gone")
            await self.hooks.registry.disable(ep.id, f"410 Gone at {iso(time.time())}")
            await self._dying(log_, ep.id, webhook_id)
            log.warning("webhook endpoint %s answered 410 Gone: disabled", ep.id)
            raise Reject(f"endpoint {ep.id} answered 410 Gone: it is now disabled")
        if after is not None and status in (429, 503):
            await record("throttled")
            await self._if_last(ctx, log_, ep.id, webhook_id)
            raise RetryLater(after, f"HTTP {status} from endpoint {ep.id}; Retry-After {after:g} s")
        await record("failed")
        await self._if_last(ctx, log_, ep.id, webhook_id)
        raise DeliveryFailed(f"HTTP {status} from endpoint {ep.id}: {text}")

    async def _if_last(
        self, ctx: Context, log_: AttemptLog, endpoint: str, webhook_id: str
    ) -> None:
        if ctx.is_last_attempt:
            await self._dying(log_, endpoint, webhook_id)

    async def _dying(self, log_: AttemptLog, endpoint: str, webhook_id: str) -> None:
        """The delivery ends dead: keep its log as long as the dead job."""
        await log_.keep(endpoint, webhook_id, None)


#: header of a continuation: the attempts its delivery used before it
BEFORE = "webhook_attempts_before"


def attempts_before(m: Message) -> int:
    try:
        return max(0, int(m.headers.get(BEFORE, 0)))
    except (TypeError, ValueError):
        return 0


def attempt_number(m: Message) -> int:
    """The delivery's attempt number, counting those of the jobs it continues."""
    return attempts_before(m) + m.attempt


def continuation(m: Message, until: float) -> Message:
    """``m`` handed on to run at ``until`` without charging this attempt.

    A broker stores a new job at attempt 0, so what the delivery already
    used travels in a header (``BEFORE``), and the continuation gets only
    the attempts left: the attempts before this one are charged, this one
    is not.  ``Webhooks`` runs a continuation with the rest of the retry
    schedule, so its waits go on where the delivery's were."""
    charged = max(0, m.attempt - 1)
    cont = m.copy()
    cont.id = derived_id(f"{m.id}:defer:{m.attempt}", until)
    cont.eta = until
    cont.attempt = 0
    cont.max_attempts = max(1, m.max_attempts - charged)
    cont.headers[BEFORE] = attempts_before(m) + charged
    cont.headers["webhook_deferred_from"] = m.id
    return cont
