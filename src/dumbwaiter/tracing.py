"""Tracing: OpenTelemetry spans for every enqueue, publish and attempt.

``App(middleware=[TracingMiddleware()])`` (``pip install 'dumbwaiter[otel]'``):

* **producer span** (kind ``PRODUCER``, ``send QUEUE`` or ``publish TYPE``)
  around each enqueue or publish.  It is started in ``before_enqueue``, a
  child of whatever span is current (the web request that enqueued), and its
  W3C ``traceparent`` (and ``tracestate``) is written into the message's
  headers, so the context travels with the job through any broker; it ends in
  ``after_enqueue``, carrying the stored id.
* **consumer span** (kind ``CONSUMER``, ``process QUEUE``) around each
  attempt (``around_process``): a child of the producer span, and linked to
  it too, as the messaging conventions recommend, so tools that show links
  and tools that show parents both find it.  An event's deliveries copy the
  event's headers, so every group's attempts hang under the one publish span.
  Anything the handler enqueues becomes a child of the attempt's span.

Attributes follow the OpenTelemetry messaging semantic conventions:
``messaging.system`` = ``dumbwaiter``, ``messaging.destination.name`` (the
queue, or the event type for a publish), ``messaging.consumer.group.name``
(subscriber groups), ``messaging.message.id``,
``messaging.message.conversation_id`` (the correlation id),
``messaging.operation.type`` / ``messaging.operation.name``; and
``dumbwaiter.*`` for the rest (task, attempt, max attempts, worker).
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from .errors import MissingDependency
from .message import GROUP_PREFIX
from .middleware import CallNext, Middleware
from .version import __version__

if TYPE_CHECKING:
    from opentelemetry.trace import Span, TracerProvider

    from .context import Context
    from .message import Message

log = logging.getLogger("dumbwaiter.tracing")

SYSTEM = "dumbwaiter"
#: producer spans not ended by ``after_enqueue`` (the enqueue raised) are
#: ended with an error once this many are open, so none leaks for ever
MAX_OPEN = 10_000
#: the headers the W3C Trace Context propagator writes and reads
TRACE_HEADERS = ("traceparent", "tracestate")


def _otel() -> Any:
    try:
        from opentelemetry import trace
    except ImportError as exc:
        raise MissingDependency(
            "tracing needs opentelemetry-api, which is not installed: "
            "pip install 'dumbwaiter[otel]'"
        ) from exc
    return trace


class TracingMiddleware(Middleware):
    """Producer and consumer spans (see the module's docstring).

    ``tracer_provider`` defaults to the global one (set by the OpenTelemetry
    SDK or its auto-instrumentation)."""

    def __init__(self, tracer_provider: TracerProvider | None = None) -> None:
        trace = _otel()
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        self._trace = trace
        self.tracer = trace.get_tracer("dumbwaiter", __version__, tracer_provider=tracer_provider)
        # W3C Trace Context, whatever the process's global propagator is: the
        # header name is part of dumbwaiter's envelope (DESIGN §2)
        self.propagator = TraceContextTextMapPropagator()
        self._open: OrderedDict[str, Span] = OrderedDict()
        self._lock = threading.Lock()

    # -- producer ---------------------------------------------------------------

    def before_enqueue(self, message: Message) -> None:
        from opentelemetry.trace import SpanKind

        is_event = message.kind == "event" and not message.queue
        destination = message.name if is_event else message.queue
        operation = "publish" if is_event else "send"
        attributes: dict[str, Any] = {
            "messaging.system": SYSTEM,
            "messaging.destination.name": destination,
            "messaging.operation.type": "send",
            "messaging.operation.name": operation,
            "messaging.message.id": message.id,
            "dumbwaiter.kind": message.kind,
            "dumbwaiter.task" if message.kind == "task" else "dumbwaiter.event": message.name,
        }
        correlation = message.headers.get("correlation_id")
        if correlation is not None:
            attributes["messaging.message.conversation_id"] = str(correlation)
        if message.key is not None:
            attributes["dumbwaiter.key"] = message.key
        # a traceparent the caller put in the headers wins over the current span
        parent = self.propagator.extract(_carrier(message.headers)) if _traced(message) else None
        span = self.tracer.start_span(
            f"{operation} {destination}",
            context=parent,
            kind=SpanKind.PRODUCER,
            attributes=attributes,
        )
        carrier: dict[str, str] = {}
        self.propagator.inject(carrier, context=self._trace.set_span_in_context(span))
        message.headers.update(carrier)
        with self._lock:
            self._open[message.id] = span
            while len(self._open) > MAX_OPEN:
                _, stale = self._open.popitem(last=False)
                _fail(stale, "the enqueue did not complete")

    def after_enqueue(self, message: Message, id: str) -> None:
        with self._lock:
            span = self._open.pop(message.id, None)
        if span is None:
            return
        if id != message.id:
            # a duplicate key: the job already stored under ``id`` is the one that runs
            span.set_attribute("dumbwaiter.duplicate_of", id)
        span.end()

    # -- consumer ---------------------------------------------------------------

    async def around_process(self, ctx: Context, call_next: CallNext) -> Any:
        from opentelemetry.trace import Link, SpanKind

        m = ctx.message
        parent = self.propagator.extract(_carrier(m.headers))
        producer = self._trace.get_current_span(parent).get_span_context()
        links = [Link(producer)] if producer.is_valid else []
        attributes: dict[str, Any] = {
            "messaging.system": SYSTEM,
            "messaging.destination.name": m.queue,
            "messaging.operation.type": "process",
            "messaging.operation.name": "process",
            "messaging.message.id": m.id,
            "dumbwaiter.kind": m.kind,
            "dumbwaiter.task" if m.kind == "task" else "dumbwaiter.event": m.name,
            "dumbwaiter.attempt": m.attempt,
            "dumbwaiter.max_attempts": m.max_attempts,
            "dumbwaiter.worker.id": ctx.worker_id,
        }
        if m.queue.startswith(GROUP_PREFIX):
            attributes["messaging.consumer.group.name"] = m.queue[len(GROUP_PREFIX) :]
        if ctx.correlation_id is not None:
            attributes["messaging.message.conversation_id"] = ctx.correlation_id
        event_id = m.headers.get("event_id")
        if event_id is not None:
            attributes["dumbwaiter.event_id"] = str(event_id)
        with self.tracer.start_as_current_span(
            f"process {m.queue}",
            context=parent if producer.is_valid else None,
            kind=SpanKind.CONSUMER,
            links=links,
            attributes=attributes,
            record_exception=True,
            set_status_on_exception=True,
        ) as span:
            try:
                return await call_next()
            except BaseException as exc:
                span.set_attribute("error.type", _qualified(exc))
                raise


def _carrier(headers: Mapping[str, Any]) -> dict[str, str]:
    return {k: str(headers[k]) for k in TRACE_HEADERS if headers.get(k) is not None}


def _traced(message: Message) -> bool:
    return message.headers.get("traceparent") is not None


def _fail(span: Span, why: str) -> None:
    from opentelemetry.trace import Status, StatusCode

    span.set_status(Status(StatusCode.ERROR, why))
    span.end()


def _qualified(exc: BaseException) -> str:
    t = type(exc)
    return t.__qualname__ if t.__module__ == "builtins" else f"{t.__module__}.{t.__qualname__}"
