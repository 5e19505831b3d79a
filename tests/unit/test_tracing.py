"""Tracing with the OpenTelemetry SDK's in-memory exporter: a producer span
per enqueue/publish that writes traceparent, a consumer span per attempt that
is its child and links to it, messaging attributes."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

import dumbwaiter as dw
from dumbwaiter.testing import drain
from dumbwaiter.tracing import TracingMiddleware


@pytest.fixture
def spans() -> tuple[TracerProvider, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider, exporter


def by_kind(done: tuple[ReadableSpan, ...], kind: SpanKind) -> list[ReadableSpan]:
    return [s for s in done if s.kind == kind]


async def test_producer_and_consumer_spans(
    spans: tuple[TracerProvider, InMemorySpanExporter],
) -> None:
    provider, exporter = spans
    app = dw.App(
        "memory://",
        retry=dw.Retry(attempts=2, backoff=0.01, jitter=0),
        middleware=[TracingMiddleware(provider)],
    )
    seen: list[str] = []

    @app.task(queue="mail")
    def send(to: str, ctx: dw.Context) -> None:
        seen.append(ctx.headers["traceparent"])
        if ctx.attempt == 1:
            raise ConnectionError("smtp down")

    tracer = provider.get_tracer("test")
    with tracer.start_as_current_span("POST /signup") as request_span:
        job = await send.aenqueue("a@example.com")
    await drain(app)

    done = exporter.get_finished_spans()
    [producer] = by_kind(done, SpanKind.PRODUCER)
    consumers = by_kind(done, SpanKind.CONSUMER)
    assert len(consumers) == 2  # one per attempt

    # the producer is a child of the request that enqueued
    assert producer.parent is not None
    assert producer.parent.span_id == request_span.get_span_context().span_id
    assert producer.name == "send mail"
    assert producer.attributes is not None
    assert producer.attributes["messaging.system"] == "dumbwaiter"
    assert producer.attributes["messaging.destination.name"] == "mail"
    assert producer.attributes["messaging.operation.type"] == "send"
    assert producer.attributes["messaging.message.id"] == job.id
    assert producer.attributes["dumbwaiter.task"] == send.name

    # the W3C traceparent in the headers names the producer span
    ctx = producer.get_span_context()
    assert ctx is not None
    assert seen[0] == f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{int(ctx.trace_flags):02x}"
    assert seen[0] == seen[1]

    for attempt, span in enumerate(sorted(consumers, key=lambda s: s.start_time or 0), 1):
        assert span.name == "process mail"
        assert span.context.trace_id == ctx.trace_id
        assert span.parent is not None and span.parent.span_id == ctx.span_id
        assert [link.context.span_id for link in span.links] == [ctx.span_id]
        attrs = span.attributes or {}
        assert attrs["messaging.operation.type"] == "process"
        assert attrs["messaging.destination.name"] == "mail"
        assert attrs["messaging.message.id"] == job.id
        assert attrs["dumbwaiter.attempt"] == attempt
        assert attrs["dumbwaiter.max_attempts"] == 2
    first, second = sorted(consumers, key=lambda s: s.start_time or 0)
    assert first.status.status_code is StatusCode.ERROR
    assert (first.attributes or {})["error.type"] == "ConnectionError"
    assert any(e.name == "exception" for e in first.events)
    assert second.status.status_code is not StatusCode.ERROR


async def test_a_job_enqueued_by_a_job_continues_the_trace(
    spans: tuple[TracerProvider, InMemorySpanExporter],
) -> None:
    provider, exporter = spans
    app = dw.App("memory://", middleware=[TracingMiddleware(provider)])

    @app.task
    async def second() -> None: ...

    @app.task
    def first() -> None:
        second.enqueue()

    await first.aenqueue()
    await drain(app)
    done = exporter.get_finished_spans()
    assert len({s.context.trace_id for s in done}) == 1
    outer = next(s for s in done if s.kind == SpanKind.CONSUMER and "first" in str(s.attributes))
    inner_send = [s for s in by_kind(done, SpanKind.PRODUCER) if s.parent is not None]
    assert [s.parent.span_id for s in inner_send if s.parent] == [outer.context.span_id]


async def test_publish_span_is_the_parent_of_every_group(
    spans: tuple[TracerProvider, InMemorySpanExporter],
) -> None:
    provider, exporter = spans
    app = dw.App("memory://", middleware=[TracingMiddleware(provider)])

    class Shipped(dw.Event, type="tracing.shipped"):
        order: str

    @app.subscribe(Shipped, group="mail")
    def mail(event: Shipped) -> None: ...

    @app.subscribe(Shipped, group="stock")
    def stock(event: Shipped) -> None: ...

    event_id = await app.apublish(Shipped(order="o-9"), key="o-9")
    await drain(app)
    done = exporter.get_finished_spans()
    [publish] = by_kind(done, SpanKind.PRODUCER)
    assert publish.name == "publish tracing.shipped"
    assert (publish.attributes or {})["messaging.destination.name"] == "tracing.shipped"
    assert (publish.attributes or {})["messaging.message.id"] == event_id
    consumers = by_kind(done, SpanKind.CONSUMER)
    groups = {(s.attributes or {})["messaging.consumer.group.name"] for s in consumers}
    assert groups == {"mail", "stock"}
    for s in consumers:
        assert s.parent is not None and s.parent.span_id == publish.context.span_id
        assert (s.attributes or {})["dumbwaiter.event_id"] == event_id
        assert (s.attributes or {})["messaging.message.conversation_id"] == event_id


async def test_duplicate_key_marks_the_producer_span(
    spans: tuple[TracerProvider, InMemorySpanExporter],
) -> None:
    provider, exporter = spans
    app = dw.App("memory://", middleware=[TracingMiddleware(provider)])

    @app.task
    def once() -> None: ...

    first = await once.options(key="k").aenqueue()
    await once.options(key="k").aenqueue()
    dup = by_kind(exporter.get_finished_spans(), SpanKind.PRODUCER)[1]
    assert (dup.attributes or {})["dumbwaiter.duplicate_of"] == first.id


#: a process of its own: the global tracer provider can be set once per process
GLOBAL_PROVIDER = """
import asyncio, json
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
import dumbwaiter as dw
from dumbwaiter.testing import drain
from dumbwaiter.tracing import TracingMiddleware

# the app is made (imported) before the SDK is configured, as in most programs
app = dw.App("memory://", middleware=[TracingMiddleware()])

@app.task(queue="mail")
def send() -> None: ...

exporter = InMemorySpanExporter()
provider = TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(exporter))
trace.set_tracer_provider(provider)

async def main() -> None:
    await send.aenqueue()
    await drain(app)

asyncio.run(main())
print(json.dumps(sorted([s.name, s.kind.name] for s in exporter.get_finished_spans())))
"""


def test_without_a_provider_spans_go_to_the_global_one() -> None:
    """``TracingMiddleware()`` sends its spans to the process's global
    provider (the one the SDK or its auto-instrumentation sets)."""
    done = subprocess.run(
        [sys.executable, "-c", GLOBAL_PROVIDER],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == [["process mail", "CONSUMER"], ["send mail", "PRODUCER"]]


def test_missing_opentelemetry_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "opentelemetry", None)
    with pytest.raises(dw.MissingDependency, match=r"pip install 'dumbwaiter\[otel\]'"):
        TracingMiddleware()
