"""Events: facts that happened, published to every subscriber group.

``class OrderCreated(dw.Event, type="order.created", version=2)`` is a
pydantic model whose type and version travel with each event.  A subscriber
group is a queue (``group:NAME``) bound to event types: every group gets every
event, workers inside a group share them, and each group has its own retries
and dead letters, so a failing e-mail group never delays billing.

A consumer always receives the newest version of the class it subscribed
with: older payloads are upgraded by the app's upcasters
(``@app.upcast("order.created", from_version=1)``), and a payload that
neither validates nor upgrades is dead-lettered with the validation error.
"""

from __future__ import annotations

import inspect
import re
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar

import pydantic

from .brokers.types import Binding, delivery_of
from .context import caused_headers, context_param
from .errors import ConfigurationError, InvalidArguments
from .message import EVENT, GROUP_PREFIX, Message, check_json, uuid7
from .retry import Retry

if TYPE_CHECKING:
    from .ports import Runtime

#: ``domain.action``: lower-case words (letters, digits, underscores) joined by dots
TYPE_RULE = re.compile(r"^[a-z][a-z0-9_]*(\.[a-z][a-z0-9_]*)+$")
_GROUP_RULE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]*$")
#: the queue of a subscriber group is this prefix + the group's name

#: every Event class defined in this process, by (type, version)
REGISTRY: dict[tuple[str, int], type[Event]] = {}

Upcaster = Callable[[dict[str, Any]], dict[str, Any]]


class Event(pydantic.BaseModel):
    """Base class of events: ``class OrderCreated(dw.Event, type="order.created", version=2)``.

    The fields are the payload; the type and version are class-level and
    travel in the envelope (``name`` and ``headers["schema_version"]``).
    """

    event_type: ClassVar[str] = ""
    event_version: ClassVar[int] = 1

    def __init_subclass__(
        cls, type: str | None = None, version: int | None = None, **kwargs: Any
    ) -> None:
        super().__init_subclass__(**kwargs)
        if type is None:
            if not cls.event_type:
                raise ConfigurationError(
                    f"event class {cls.__qualname__} needs a type: "
                    f'class {cls.__name__}(dw.Event, type="domain.action", version=1)'
                )
            type = cls.event_type  # a subclass of a concrete event keeps its type
        if not isinstance(type, str) or not TYPE_RULE.match(type):
            raise ConfigurationError(
                f"event type {type!r} of {cls.__qualname__} breaks the rule: types are "
                "'domain.action', lower-case words (a-z, 0-9, _) joined by dots, "
                "e.g. 'order.created' or 'billing.invoice_paid'"
            )
        if version is None:
            version = cls.event_version if type == cls.event_type else 1
        if not isinstance(version, int) or isinstance(version, bool) or version < 1:
            raise ConfigurationError(
                f"event {type}: version must be an integer >= 1, got {version!r}"
            )
        cls.event_type = type
        cls.event_version = version
        key = (type, version)
        known = REGISTRY.get(key)
        if known is not None and _qualname(known) != _qualname(cls):
            raise ConfigurationError(
                f"two event classes are {type} version {version}: {_qualname(known)} and "
                f"{_qualname(cls)}; bump the version of the new one"
            )
        REGISTRY[key] = cls


def _qualname(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def group_queue(group: str) -> str:
    """The queue a subscriber group consumes: ``group:NAME``."""
    if not isinstance(group, str) or not _GROUP_RULE.match(group):
        raise ConfigurationError(
            f"group name {group!r}: use letters, digits, '_', '.', '-' (e.g. 'email')"
        )
    return GROUP_PREFIX + group


class Subscription:
    """A handler of one event type in one group.  The worker runs it like a task:
    ``bind`` turns a delivered message into the handler's arguments."""

    kind = "event"
    keep_result: float | None = None

    def __init__(
        self,
        app: Runtime,
        event: type[Event],
        group: str,
        fn: Callable[..., Any],
        *,
        retry: Retry,
        timeout: float | None,
    ) -> None:
        if not (isinstance(event, type) and issubclass(event, Event) and event.event_type):
            raise ConfigurationError(f"subscribe takes an Event class, got {event!r}")
        self.app = app
        self.event = event
        self.group = group
        self.queue = group_queue(group)
        self.fn = fn
        self.name = f"{event.event_type}@{group}"
        self.retry = retry
        self.timeout = timeout
        self.is_async = inspect.iscoroutinefunction(fn)
        self.context_param = context_param(fn)
        params = [
            p
            for p in inspect.signature(fn).parameters.values()
            if p.name != self.context_param
            and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
        ]
        if not params:
            raise ConfigurationError(
                f"handler {fn.__qualname__} of {self.name} must take the event as its "
                "first parameter: def handler(event: OrderCreated, ctx: dw.Context)"
            )

    def __repr__(self) -> str:
        return f"<Subscription {self.name} -> {self.fn.__qualname__}>"

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.fn(*args, **kwargs)

    def bind(self, msg: Message) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """The handler's arguments: the payload, upgraded to this subscription's
        version and validated; ``InvalidArguments`` (dead-lettered) otherwise."""
        payload = msg.payload if isinstance(msg.payload, dict) else None
        if payload is None:
            raise InvalidArguments(f"event {msg.name} carries no payload object")
        version = _version(msg)
        target = self.event.event_version
        if version < target:
            payload = self.app.upgrade(msg.name, version, target, payload)
        try:
            event = self.event.model_validate(payload)
        except pydantic.ValidationError as exc:
            raise InvalidArguments(
                f"event {msg.name} version {version} does not validate as "
                f"{self.event.__qualname__} version {target}: {exc}"
            ) from None
        return (event,), {}


def _version(msg: Message) -> int:
    try:
        return int(msg.headers.get("schema_version", 1))
    except (TypeError, ValueError):
        return 1


def event_message(event: Event, key: str | None, headers: dict[str, Any] | None) -> Message:
    """The envelope of a published event (checked for JSON at the call)."""
    if not isinstance(event, Event) or not type(event).event_type:
        raise ConfigurationError(f"publish takes a dw.Event instance, got {event!r}")
    if key is not None and (not isinstance(key, str) or not key):
        raise ConfigurationError(f"key must be a non-empty string, got {key!r}")
    cls = type(event)
    return event_message_of(
        cls.event_type, cls.event_version, event.model_dump(mode="json"), key, headers
    )


def event_message_of(
    event_type: str,
    version: int,
    payload: dict[str, Any],
    key: str | None,
    headers: dict[str, Any] | None,
) -> Message:
    """The envelope of an event of ``event_type`` whose ``payload`` is in schema
    ``version``: ``event_message``'s, and the CLI's when it publishes by name
    with no event class at hand (subscribers validate it then)."""
    check_json(payload, f"the payload of event {event_type}")
    if headers is not None:
        check_json(headers, "headers")
    id_ = uuid7()
    h = caused_headers(headers)
    h["schema_version"] = version
    h.setdefault("correlation_id", id_)
    # by position, in the fields' order: cheaper than by keyword
    return Message(
        id_, EVENT, event_type, "", [], {}, payload, h, 0, 1, time.time(), None, 0, key, []
    )


async def replay(
    app: Runtime,
    event_type: str,
    group: str,
    *,
    since: float | None = None,
    until: float | None = None,
    force: bool = False,
) -> int:
    """Deliver logged events of ``event_type`` again to one ``group``.

    For a new consumer, or after a bug fix: each event in ``[since, until]``
    becomes a new delivery in the group's queue.  The group's inbox keeps this
    harmless where it already handled an event (those are acked without
    running); ``force`` skips the inbox, for rebuilding a projection from the
    log.  Returns how many deliveries were made."""
    queue = group_queue(group)
    sub = app.subscriptions.get((queue, event_type))
    attempts = sub.retry.attempts if sub is not None else app.retry.attempts
    binding = Binding(event_type, queue, attempts)
    total = 0
    cursor = None
    while True:
        page, cursor = await app.broker.list_events(event_type, since, until, cursor)
        copies = [delivery_of(e, binding, uuid7()) for e in page]
        for c in copies:
            c.headers["replay"] = True
            if force:
                c.headers["inbox"] = "skip"
        if copies:
            await app.broker.enqueue(copies)
        total += len(copies)
        if cursor is None:
            return total
