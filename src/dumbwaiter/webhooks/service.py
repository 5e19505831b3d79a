"""``app.webhooks``: endpoints, sending, fan-out of events, and the admin view.

Created on first use of ``app.webhooks``; that registers the delivery task
(queue ``webhooks``), so touch it (``app.webhooks.configure(...)``, or
``app.webhooks.forward(SomeEvent)``) where the app is defined: a worker
imports that module and must know the task.

* Endpoints live in the broker's kv store (``Registry``), shared by every
  process; each has a URL, a secret, the event types it wants, and its own
  rate limit and concurrency.
* ``send(endpoint, event)`` makes one delivery job; ``forward(EventClass)``
  subscribes a group (``webhooks``) to the event type, whose handler makes a
  delivery for every enabled endpoint that wants it.  The group is an
  ordinary subscriber group (docs/events.md), so a published event is in
  the broker before any webhook logic runs: nothing is lost between the
  publish and the fan-out, and the fan-out's own retries and inbox apply.
* Per-endpoint limits reuse the worker's flow control: a delivery carries
  its endpoint's id as its ``limit_key`` and the endpoint's limits in its
  headers, and ``App.task_resolvers`` hands the worker a copy of the
  delivery task with those limits, so a delivery over its endpoint's limit
  is given back without using an attempt, exactly as a limited task's job.
"""

from __future__ import annotations

import copy
import re
import time
from collections.abc import Callable, Coroutine, Iterable, Sequence
from dataclasses import dataclass, replace
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Protocol, TypeVar, cast

from ..brokers.types import JobFilter, JobInfo
from ..errors import ConfigurationError
from ..flow import Flow
from ..job import Job
from ..message import check_json, uuid7
from ..retry import Retry
from ..state import State
from ..task import SendOptions
from . import breaker
from .attempts import Attempt, AttemptLog
from .breaker import BreakerPolicy
from .delivery import TASK_NAME, Deliverer, attempts_before, deliver, derived_id, iso, webhooks_of
from .endpoints import (
    Endpoint,
    EndpointDisabled,
    Registry,
    check_event_types,
    check_limits,
    check_url,
    new_endpoint,
)
from .settings import SPEC_RETRY as SPEC_RETRY
from .settings import SPEC_SCHEDULE as SPEC_SCHEDULE
from .settings import Settings
from .signing import check_secret, new_secret
from .ssrf import AddressPolicy

if TYPE_CHECKING:
    from ..brokers.base import Broker
    from ..context import Context
    from ..event import Event, Subscription
    from ..message import Message
    from ..task import Task

T = TypeVar("T")
F = TypeVar("F", bound=Callable[..., Any])


class Host(Protocol):
    """The app as its webhooks see it (``App`` is one): the broker, and the
    registry they add their delivery task and fan-out group to."""

    @property
    def broker(self) -> Broker: ...

    @property
    def tasks(self) -> dict[str, Task[..., Any]]: ...

    @property
    def task_resolvers(self) -> dict[str, Callable[[Message], Task[..., Any]]]: ...

    def _register(self, fn: Callable[..., Any], options: dict[str, Any]) -> Task[..., Any]: ...

    def subscribe(
        self,
        event: type[Event],
        *,
        group: str,
        retry: Retry | bool | None = None,
        timeout: float | timedelta | None = None,
    ) -> Callable[[F], Subscription]: ...

    def _call(self, coro: Coroutine[Any, Any, T]) -> T: ...


#: a caller's own ``webhook-id``: no '.' (the signed content is dot-separated) nor ':'
_WEBHOOK_ID = re.compile(r"^[A-Za-z0-9_\-]{1,200}$")
_HEADER = "webhook_limits"


@dataclass(frozen=True, slots=True)
class Sent:
    """What ``send`` made: the delivery's ``webhook-id``, endpoint and job."""

    webhook_id: str
    endpoint: str
    job: Job[Any]


class Webhooks:
    """``app.webhooks`` (see the module's docstring)."""

    def __init__(self, app: Host) -> None:
        self.app = app
        self.settings = Settings()
        self.registry = Registry(app.broker)
        self.log = AttemptLog(app.broker)
        self.deliverer = Deliverer(self)
        #: event types forwarded to endpoints (``forward``)
        self.forwarded: dict[str, type[Event]] = {}
        #: endpoint id -> (rate, concurrency) last read in this process
        self._limits: dict[str, tuple[tuple[int, float] | None, int | None]] = {}
        #: the delivery task with an endpoint's limits, or the rest of its
        #: schedule: (rate, concurrency, attempts before) -> task
        self._variants: dict[tuple[tuple[int, float] | None, int | None, int], Task[..., Any]] = {}
        self.task = self._register()
        app.task_resolvers[TASK_NAME] = self._handler_for

    def __repr__(self) -> str:
        return f"<Webhooks queue={self.settings.queue} forwarded={sorted(self.forwarded)}>"

    # -- configuration ------------------------------------------------------------

    def configure(
        self,
        *,
        queue: str | None = None,
        group: str | None = None,
        retry: Retry | None = None,
        timeout: float | timedelta | None = None,
        connect_timeout: float | timedelta | None = None,
        allow_private: bool | None = None,
        allow: Iterable[str] | None = None,
        breaker_threshold: int | None = None,
        breaker_cooldown: float | timedelta | None = None,
        breaker_max_cooldown: float | timedelta | None = None,
        retention: float | timedelta | None = None,
        default_concurrency: int | bool | None = False,
        max_connections: int | None = None,
    ) -> Settings:
        """Change how deliveries are made; call it where the app is defined, so
        producers and workers agree.  Every value is checked here."""
        s = self.settings
        changes: dict[str, Any] = {}
        if queue is not None:
            changes["queue"] = _name(queue, "queue")
        if group is not None:
            if self.forwarded:
                raise ConfigurationError("configure(group=) must come before forward()")
            changes["group"] = _name(group, "group")
        if retry is not None:
            if not isinstance(retry, Retry):
                raise ConfigurationError(f"retry= takes a dw.Retry, got {retry!r}")
            changes["retry"] = retry
        if timeout is not None:
            changes["timeout"] = _positive(timeout, "timeout")
        if connect_timeout is not None:
            changes["connect_timeout"] = _positive(connect_timeout, "connect_timeout")
        if allow_private is not None:
            changes["allow_private"] = bool(allow_private)
        if allow is not None:
            allow = tuple(allow) if not isinstance(allow, str) else allow
            AddressPolicy.make(False, allow)  # checks every entry
            changes["allow"] = tuple(allow)
        pol = _policy(s.breaker, breaker_threshold, breaker_cooldown, breaker_max_cooldown)
        if retention is not None:
            changes["retention"] = _positive(retention, "retention")
        if default_concurrency is not False:
            changes["default_concurrency"] = _concurrency(default_concurrency)
        if max_connections is not None:
            changes["max_connections"] = _count(max_connections, "max_connections")
        timeout_now = changes.get("timeout", s.timeout)
        pol = replace(pol, probe_timeout=max(pol.probe_timeout, 2 * timeout_now + 10))
        self.settings = replace(s, **changes, breaker=pol)
        self.task = self._register()
        self.deliverer.reset()
        return self.settings

    def _register(self) -> Task[..., Any]:
        s = self.settings
        existing = self.app.tasks.get(TASK_NAME)
        if existing is not None:
            del self.app.tasks[TASK_NAME]  # replaced with the new settings
        self._variants.clear()
        return self.app._register(
            deliver,
            {
                "name": TASK_NAME,
                "queue": s.queue,
                "retry": s.retry,
                "timeout": max(60.0, 4 * s.timeout),
                "keep_result": s.retention,
            },
        )

    def forward(self, *events: type[Event]) -> None:
        """Deliver every published event of these classes to the endpoints that
        subscribe to its type (or to all types).  Call it where the app is
        defined: workers bind the fan-out group when they start."""
        from ..event import Event

        for cls in events:
            if not (isinstance(cls, type) and issubclass(cls, Event) and cls.event_type):
                raise ConfigurationError(f"forward takes dw.Event classes, got {cls!r}")
            self.forwarded[cls.event_type] = cls
            self.app.subscribe(cls, group=self.settings.group)(_fan_out)

    # -- the worker's view: per-endpoint limits ---------------------------------

    def remember(self, ep: Endpoint) -> None:
        """Note an endpoint's limits as last read (deliveries use the newest)."""
        self._limits[ep.id] = (ep.rate_limit, ep.concurrency)

    def _handler_for(self, msg: Message) -> Task[..., Any]:
        """The delivery task with the limits of ``msg``'s endpoint (see the
        module's docstring): this process's newest reading of the endpoint,
        else what the delivery was made with."""
        limits = self._limits.get(str(msg.headers.get("limit_key", "")))
        if limits is None:
            raw = msg.headers.get(_HEADER)
            if isinstance(raw, list) and len(raw) == 3:
                n, per, conc = raw
                limits = ((int(n), float(per)) if n else None, int(conc) if conc else None)
            else:
                limits = (None, None)
        before = attempts_before(msg)
        if limits == (None, None) and not before:
            return self.task
        key = (*limits, before)
        variant = self._variants.get(key)
        if variant is None:
            variant = copy.copy(self.task)
            if limits != (None, None):
                variant.flow = Flow(rate=limits[0], concurrency=limits[1])
            if before:  # a continuation: the rest of the schedule (delivery.continuation)
                r = self.task.retry
                rest = r.backoff[before:] or r.backoff[-1:]
                variant.retry = Retry(r.attempts, rest, r.jitter, r.retry_on, r.dead_on)
            self._variants[key] = variant
        return variant

    def _message(
        self,
        ep: Endpoint,
        webhook_id: str,
        event_type: str,
        data: Any,
        occurred_at: float,
        job_id: str | None,
    ) -> Message:
        msg = self.task.message(
            (ep.id, webhook_id, event_type, data, iso(occurred_at)), {}, SendOptions.make()
        )
        if job_id is not None:
            msg.id = job_id
        rate = ep.rate_limit
        msg.headers["limit_key"] = ep.id
        msg.headers[_HEADER] = [rate[0] if rate else 0, rate[1] if rate else 0, ep.concurrency or 0]
        msg.headers["webhook_id"] = webhook_id
        return msg

    # -- sending --------------------------------------------------------------

    async def asend(
        self,
        endpoint: Endpoint | str,
        event: Event | str,
        data: Any = None,
        *,
        webhook_id: str | None = None,
    ) -> Sent:
        """Deliver one webhook to ``endpoint``: ``asend(ep, OrderPaid(...))`` or
        ``asend(ep, "order.paid", {...})``.  The endpoint is read again here,
        so a disabled one fails at the call (``EndpointDisabled``).  With your
        own ``webhook_id``, sending it twice to one endpoint makes one delivery."""
        ep_id = endpoint.id if isinstance(endpoint, Endpoint) else endpoint
        ep = await self.registry.get(ep_id)
        self.remember(ep)
        if ep.disabled:
            raise EndpointDisabled(
                f"webhook endpoint {ep.id!r} is disabled ({ep.disabled_reason or 'no reason'})"
            )
        event_type, payload = _event_parts(event, data)
        now = time.time()
        if webhook_id is None:
            wid = "msg_" + uuid7().replace("-", "")
        elif not isinstance(webhook_id, str) or not _WEBHOOK_ID.match(webhook_id):
            raise ConfigurationError(
                f"webhook_id {webhook_id!r}: letters, digits, '_' and '-' only (up to 200)"
            )
        else:
            wid = webhook_id
        msg = self._message(ep, wid, event_type, payload, now, None)
        if webhook_id is not None:  # the same id twice: the first send's job
            msg.id = await self._stable_id(wid, ep.id, msg.id)
        [jid] = await self.app.broker.enqueue([msg])
        return Sent(webhook_id=wid, endpoint=ep.id, job=Job(self.app, jid))

    def send(
        self,
        endpoint: Endpoint | str,
        event: Event | str,
        data: Any = None,
        *,
        webhook_id: str | None = None,
    ) -> Sent:
        """``asend`` for sync callers."""
        return self._call(self.asend(endpoint, event, data, webhook_id=webhook_id))

    async def _stable_id(self, webhook_id: str, endpoint: str, job_id: str) -> str:
        """The job id of a caller-chosen ``webhook_id`` for one endpoint: the
        first send's (kept in kv as long as deliveries are), so a repeat finds it."""
        key = f"webhooks:sent:{endpoint}:{webhook_id}"
        if await self.app.broker.kv_add(key, job_id.encode(), ttl=self.settings.retention):
            return job_id
        held = (await self.app.broker.kv_get([key])).get(key)
        return held.decode() if held is not None else job_id

    async def fan_out(self, event: Event, ctx: Context) -> int:
        """The ``webhooks`` group's handler: one delivery per enabled endpoint
        subscribed to the event's type.  Each delivery's id is derived from the
        event and the endpoint, so a retried or redelivered fan-out makes no
        second delivery."""
        msg = ctx.message
        event_id = str(msg.headers.get("event_id") or msg.id)
        event_type = msg.name
        wid = "msg_" + event_id.replace("-", "")
        data = event.model_dump(mode="json")
        out = []
        for ep in await self.registry.all():
            self.remember(ep)
            if ep.disabled or not ep.subscribes(event_type):
                continue
            jid = derived_id(f"{event_id}\x1f{ep.id}", msg.created_at or time.time())
            out.append(self._message(ep, wid, event_type, data, msg.created_at, jid))
        if out:
            await self.app.broker.enqueue(out)
        return len(out)

    # -- endpoints ----------------------------------------------------------------

    async def aadd_endpoint(
        self,
        url: str,
        *,
        event_types: Iterable[str] | None = None,
        secret: str | None = None,
        rate_limit: str | tuple[int, float] | None = None,
        concurrency: int | bool | None = True,
        id: str | None = None,
        description: str = "",
        metadata: dict[str, Any] | None = None,
    ) -> Endpoint:
        """Register an endpoint; every argument is checked here.  ``secret``
        defaults to a new one (give it to the receiver: ``endpoint.secret``);
        ``event_types`` empty means every forwarded type; ``concurrency``
        defaults to the settings' ``default_concurrency``."""
        conc = self.settings.default_concurrency if concurrency is True else concurrency
        if conc is False:
            conc = None
        ep = new_endpoint(
            url,
            id=id,
            secret=secret,
            event_types=event_types,
            known_types=sorted(self.forwarded),
            rate_limit=rate_limit,
            concurrency=conc,
            description=description,
            metadata=metadata,
        )
        self._check_limits(ep)
        await self.registry.add(ep)
        self.remember(ep)
        return ep

    def add_endpoint(
        self,
        url: str,
        *,
        event_types: Iterable[str] | None = None,
        secret: str | None = None,
        rate_limit: str | tuple[int, float] | None = None,
        concurrency: int | bool | None = True,
        id: str | None = None,
        description: str = "",
        metadata: dict[str, Any] | None = None,
    ) -> Endpoint:
        """``aadd_endpoint`` for sync callers."""
        return self._call(
            self.aadd_endpoint(
                url,
                event_types=event_types,
                secret=secret,
                rate_limit=rate_limit,
                concurrency=concurrency,
                id=id,
                description=description,
                metadata=metadata,
            )
        )

    def _check_limits(self, ep: Endpoint) -> None:
        if (ep.rate_limit or ep.concurrency) and not self.app.broker.capabilities.limits:
            raise ConfigurationError(
                f"the {type(self.app.broker).__name__} broker has no flow control; an endpoint "
                "cannot have rate_limit or concurrency on it"
            )

    async def aendpoint(self, endpoint_id: str) -> Endpoint:
        ep = await self.registry.get(endpoint_id)
        self.remember(ep)
        return ep

    def endpoint(self, endpoint_id: str) -> Endpoint:
        """One endpoint (``EndpointNotFound`` if none has this id)."""
        return self._call(self.aendpoint(endpoint_id))

    async def aendpoints(self) -> list[Endpoint]:
        eps = await self.registry.all()
        for ep in eps:
            self.remember(ep)
        return eps

    def endpoints(self) -> list[Endpoint]:
        """Every registered endpoint, oldest first."""
        return self._call(self.aendpoints())

    async def aupdate_endpoint(self, endpoint_id: str, **changes: Any) -> Endpoint:
        """Change ``url``, ``event_types``, ``rate_limit``, ``concurrency``,
        ``description`` or ``metadata`` of an endpoint (checked as at add)."""
        allowed = {"url", "event_types", "rate_limit", "concurrency", "description", "metadata"}
        unknown = set(changes) - allowed
        if unknown:
            raise ConfigurationError(
                f"unknown endpoint field(s) {sorted(unknown)}; {sorted(allowed)}"
            )
        fields: dict[str, Any] = {}
        if "url" in changes:
            fields["url"] = check_url(changes["url"])
        if "event_types" in changes:
            fields["event_types"] = check_event_types(
                changes["event_types"], sorted(self.forwarded)
            )
        if "rate_limit" in changes or "concurrency" in changes:
            current = await self.registry.get(endpoint_id)
            rate, conc = check_limits(
                changes.get("rate_limit", current.rate_limit),
                changes.get("concurrency", current.concurrency),
                endpoint_id,
            )
            fields["rate_limit"], fields["concurrency"] = rate, conc
        if "description" in changes:
            fields["description"] = str(changes["description"])
        if "metadata" in changes:
            check_json(changes["metadata"], "endpoint metadata")
            fields["metadata"] = dict(changes["metadata"] or {})
        ep = await self.registry.update(endpoint_id, lambda e: replace(e, **fields))
        self._check_limits(ep)
        self.remember(ep)
        return ep

    def update_endpoint(self, endpoint_id: str, **changes: Any) -> Endpoint:
        return self._call(self.aupdate_endpoint(endpoint_id, **changes))

    async def arotate_secret(
        self, endpoint_id: str, secret: str | None = None, *, keep_old_for: float = 86400.0
    ) -> Endpoint:
        """Give an endpoint a new secret; the old one still signs (a second
        signature in the header) for ``keep_old_for`` seconds, while the
        receiver switches over."""
        new = check_secret(secret) if secret is not None else new_secret()
        until = time.time() + float(keep_old_for)

        def change(e: Endpoint) -> Endpoint:
            old = tuple((s, u) for s, u in e.old_secrets if u > time.time())
            return replace(e, secret=new, old_secrets=((e.secret, until), *old))

        return await self.registry.update(endpoint_id, change)

    def rotate_secret(
        self, endpoint_id: str, secret: str | None = None, *, keep_old_for: float = 86400.0
    ) -> Endpoint:
        return self._call(self.arotate_secret(endpoint_id, secret, keep_old_for=keep_old_for))

    async def adisable(self, endpoint_id: str, reason: str = "disabled by an operator") -> Endpoint:
        return await self.registry.disable(endpoint_id, reason)

    def disable(self, endpoint_id: str, reason: str = "disabled by an operator") -> Endpoint:
        """Stop delivering to an endpoint: new events skip it, ``send`` refuses,
        and deliveries already queued are dead-lettered with the reason when
        their turn comes (replay them after ``enable``)."""
        return self._call(self.adisable(endpoint_id, reason))

    async def aenable(self, endpoint_id: str) -> Endpoint:
        ep = await self.registry.enable(endpoint_id)
        await self.app.broker.kv_delete([breaker.key_of(endpoint_id)])  # a fresh start
        return ep

    def enable(self, endpoint_id: str) -> Endpoint:
        """Deliver to the endpoint again (its circuit breaker starts closed)."""
        return self._call(self.aenable(endpoint_id))

    async def aremove(self, endpoint_id: str) -> bool:
        gone = await self.registry.remove(endpoint_id)
        await self.app.broker.kv_delete([breaker.key_of(endpoint_id)])
        self._limits.pop(endpoint_id, None)
        return gone

    def remove(self, endpoint_id: str) -> bool:
        """Unregister an endpoint (its queued deliveries dead-letter, naming it)."""
        return self._call(self.aremove(endpoint_id))

    # -- what happened: attempts, health, dead letters, replay ------------------------

    async def aattempts(self, endpoint_id: str, webhook_id: str) -> list[Attempt]:
        return await self.log.of(endpoint_id, webhook_id)

    def attempts(self, endpoint_id: str, webhook_id: str) -> list[Attempt]:
        """Every attempt of one delivery, oldest first (status, latency, answer)."""
        return self._call(self.aattempts(endpoint_id, webhook_id))

    async def adead(self, endpoint_id: str | None = None, limit: int = 1000) -> list[JobInfo]:
        """Dead deliveries (to ``endpoint_id``, or to any endpoint), newest first."""
        out: list[JobInfo] = []
        cursor = None
        f = JobFilter(queue=self.settings.queue, name=TASK_NAME, state=State.DEAD)
        while len(out) < limit:
            page = await self.app.broker.list_jobs(f, cursor, 200)
            out += [i for i in page.items if endpoint_id is None or _endpoint_of(i) == endpoint_id]
            cursor = page.cursor
            if cursor is None:
                break
        return out[:limit]

    def dead(self, endpoint_id: str | None = None, limit: int = 1000) -> list[JobInfo]:
        return self._call(self.adead(endpoint_id, limit))

    async def areplay(self, endpoint_id: str, ids: Sequence[str] | None = None) -> int:
        """Deliver dead deliveries of an endpoint again (all, or those ``ids``),
        with fresh attempts and the same ``webhook-id``.  Returns how many."""
        dead = [i.message.id for i in await self.adead(endpoint_id, limit=100_000)]
        if ids is not None:
            wanted = set(ids)
            dead = [i for i in dead if i in wanted]
        total = 0
        for start in range(0, len(dead), 500):
            chunk = tuple(dead[start : start + 500])
            total += await self.app.broker.replay(JobFilter(ids=chunk, state=State.DEAD))
        return total

    def replay(self, endpoint_id: str, ids: Sequence[str] | None = None) -> int:
        return self._call(self.areplay(endpoint_id, ids))

    def describe(self, info: JobInfo) -> dict[str, Any]:
        """A delivery job as an admin view shows it: its endpoint, ``webhook-id``,
        event type, when the event happened, the attempts it used (those of
        the jobs it continues included), its state, when it last changed
        (died, for a dead one) and its last error.  Raises ``ValueError`` for
        a job that is not a delivery."""
        m = info.message
        if m.name != TASK_NAME or len(m.args) < 5:
            raise ValueError(f"job {m.id} is not a webhook delivery ({m.name})")
        last = m.errors[-1] if m.errors else None
        return {
            "job_id": m.id,
            "endpoint": str(m.args[0]),
            "webhook_id": str(m.args[1]),
            "event_type": str(m.args[2]),
            "occurred_at": str(m.args[4]),
            "attempts": attempts_before(m) + m.attempt,
            "state": info.state.value,
            "updated_at": info.updated_at,
            "error": f"{last.type.rsplit('.', 1)[-1]}: {last.message}" if last else "",
        }

    async def ahealth(
        self, endpoint_id: str | None = None, minutes: int = 60
    ) -> list[dict[str, Any]]:
        """Per endpoint (or one): disabled state, breaker, successes and failures
        and the failure rate over ``minutes``, and the dead deliveries count:
        what an endpoints page shows."""
        eps = [await self.aendpoint(endpoint_id)] if endpoint_id else await self.aendpoints()
        dead: dict[str, int] = {}
        for info in await self.adead(endpoint_id, limit=100_000):
            e = _endpoint_of(info)
            dead[e] = dead.get(e, 0) + 1
        states = await self.app.broker.kv_get([breaker.key_of(e.id) for e in eps])
        out = []
        for ep in eps:
            ok, fail = await self.log.counts(ep.id, minutes)
            b = breaker.load(states.get(breaker.key_of(ep.id)))
            opened = b.get("opened_at")
            out.append(
                {
                    **ep.to_dict(),
                    "breaker": b.get("state", breaker.CLOSED),
                    "consecutive_failures": int(b.get("failures", 0)),
                    "breaker_opened_at": opened,
                    # when an open breaker lets its next probe through
                    "breaker_probe_at": (
                        float(opened) + float(b.get("cooldown", self.settings.breaker.cooldown))
                        if b.get("state") == breaker.OPEN and opened is not None
                        else None
                    ),
                    "delivered": ok,
                    "failed": fail,
                    "failure_rate": (fail / (ok + fail)) if ok + fail else 0.0,
                    "window_minutes": minutes,
                    "dead": dead.get(ep.id, 0),
                }
            )
        return out

    def health(self, endpoint_id: str | None = None, minutes: int = 60) -> list[dict[str, Any]]:
        return self._call(self.ahealth(endpoint_id, minutes))

    async def aclose(self) -> None:
        """Close the pooled client of the running loop."""
        await self.deliverer.aclose()

    def _call(self, coro: Coroutine[Any, Any, T]) -> T:
        return self.app._call(coro)


async def _fan_out(event: Event, ctx: Context) -> int:
    """The ``webhooks`` group's handler (``Webhooks.fan_out``)."""
    return await cast("Webhooks", webhooks_of(ctx.app)).fan_out(event, ctx)


def _endpoint_of(info: JobInfo) -> str:
    args = info.message.args
    return str(args[0]) if args else ""


def _event_parts(event: Event | str, data: Any) -> tuple[str, Any]:
    if isinstance(event, str):
        check_event_types([event], ())
        check_json(data, f"the data of webhook {event}")
        return event, data
    from ..event import Event

    if not isinstance(event, Event) or not type(event).event_type:
        raise ConfigurationError(f"send takes a dw.Event or an event type and data, got {event!r}")
    if data is not None:
        raise ConfigurationError("send(endpoint, event) takes no data: the event is the data")
    return type(event).event_type, event.model_dump(mode="json")


def _policy(
    pol: BreakerPolicy,
    threshold: int | None,
    cooldown: float | timedelta | None,
    max_cooldown: float | timedelta | None,
) -> BreakerPolicy:
    if threshold is not None:
        pol = replace(pol, threshold=_count(threshold, "breaker_threshold"))
    if cooldown is not None:
        pol = replace(pol, cooldown=_positive(cooldown, "breaker_cooldown"))
    if max_cooldown is not None:
        pol = replace(pol, max_cooldown=_positive(max_cooldown, "breaker_max_cooldown"))
    return pol


def _count(value: int, what: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ConfigurationError(f"{what} must be an integer >= 1, got {value!r}")
    return value


def _concurrency(value: int | bool | None) -> int | None:
    if value is True or value is False:
        raise ConfigurationError("default_concurrency takes an integer or None")
    check_limits(None, value, "default")
    return value


def _positive(value: float | timedelta, what: str) -> float:
    s = value.total_seconds() if isinstance(value, timedelta) else value
    if not isinstance(s, int | float) or isinstance(s, bool) or s <= 0:
        raise ConfigurationError(f"{what} must be a positive number of seconds, got {value!r}")
    return float(s)


def _name(value: str, what: str) -> str:
    if not isinstance(value, str) or not re.match(r"^[A-Za-z0-9][A-Za-z0-9_.\-]*$", value):
        raise ConfigurationError(f"{what} {value!r}: letters, digits, '_', '.', '-'")
    return value


__all__ = ["SPEC_RETRY", "SPEC_SCHEDULE", "Sent", "Settings", "Webhooks"]
