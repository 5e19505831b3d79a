"""Deliveries against real receivers (uvicorn on loopback), on the brokers of
``conftest.broker_url``: signing, retries with a stable webhook-id,
Retry-After, 410, timeouts, the breaker, per-endpoint limits, dead letters
and replay, fan-out of published events, the attempt log."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import replace

import pytest

import dumbwaiter as dw
from dumbwaiter.event import replay as replay_events
from dumbwaiter.state import State
from dumbwaiter.testing import drain
from dumbwaiter.webhooks import EndpointDisabled, EndpointNotFound, verify

from .receiver import Receiver


class OrderPaid(dw.Event, type="hooktest.order_paid"):
    order_id: str
    cents: int


class OrderShipped(dw.Event, type="hooktest.order_shipped"):
    order_id: str


async def test_a_delivery_is_signed_lands_once_and_is_logged(
    app: dw.App, receiver: tuple[Receiver, str]
) -> None:
    rec, base = receiver
    ep = await app.webhooks.aadd_endpoint(base + "/ok")
    sent = await app.webhooks.asend(ep, OrderPaid(order_id="A1", cents=1250))
    await drain(app)
    [req] = rec.requests
    verify(ep.secret, req.headers, req.body)  # a receiver's check passes
    assert req.webhook_id == sent.webhook_id
    assert req.headers["content-type"] == "application/json"
    body = json.loads(req.body)
    assert body["type"] == "hooktest.order_paid"
    assert body["data"] == {"order_id": "A1", "cents": 1250}
    assert body["timestamp"].endswith("Z")
    info = await app.broker.get(sent.job.id)
    assert info is not None and info.state == State.SUCCEEDED
    [attempt] = await app.webhooks.aattempts(ep.id, sent.webhook_id)
    assert (attempt.outcome, attempt.status, attempt.response) == ("delivered", 200, "ok")
    assert attempt.latency_ms is not None and attempt.job_id == sent.job.id
    [health] = await app.webhooks.ahealth(ep.id)
    assert (health["delivered"], health["failed"], health["dead"]) == (1, 0, 0)
    assert health["breaker"] == "closed" and "secret" not in health
    assert health["breaker_probe_at"] is None


async def test_retries_keep_the_webhook_id_and_sign_each_attempt_afresh(
    app: dw.App, receiver: tuple[Receiver, str]
) -> None:
    rec, base = receiver
    ep = await app.webhooks.aadd_endpoint(base + "/flaky/2")
    sent = await app.webhooks.asend(ep, "hooktest.order_paid", {"order_id": "B2", "cents": 1})
    await drain(app)
    reqs = rec.requests
    assert [r.webhook_id for r in reqs] == [sent.webhook_id] * 3  # receivers can de-duplicate
    for r in reqs:
        verify(ep.secret, r.headers, r.body)
    assert len({r.body for r in reqs}) == 1  # the same bytes every time
    log = await app.webhooks.aattempts(ep.id, sent.webhook_id)
    assert [(a.outcome, a.status, a.attempt) for a in log] == [
        ("failed", 500, 1),
        ("failed", 500, 2),
        ("delivered", 200, 3),
    ]


async def test_out_of_attempts_is_dead_with_the_answer_and_replays_to_the_endpoint(
    app: dw.App, receiver: tuple[Receiver, str]
) -> None:
    rec, base = receiver
    ep = await app.webhooks.aadd_endpoint(base + "/fail")
    other = await app.webhooks.aadd_endpoint(base + "/ok")
    sent = await app.webhooks.asend(ep, "hooktest.order_paid", {"order_id": "C3", "cents": 2})
    await app.webhooks.asend(other, "hooktest.order_paid", {"order_id": "C4", "cents": 2})
    await drain(app)
    info = await app.broker.get(sent.job.id)
    assert info is not None and info.state == State.DEAD
    assert "HTTP 500" in info.message.errors[-1].message
    log = await app.webhooks.aattempts(ep.id, sent.webhook_id)
    assert len(log) == 3 and all(a.status == 500 for a in log)
    assert len(log[-1].response.encode()) == 1024 and log[-1].response.startswith("boom")
    assert [i.message.id for i in await app.webhooks.adead(ep.id)] == [sent.job.id]
    assert await app.webhooks.adead(other.id) == []
    [health] = await app.webhooks.ahealth(ep.id)
    assert (health["failed"], health["dead"], health["failure_rate"]) == (3, 1, 1.0)
    # what an admin page shows of the dead delivery
    [dead] = await app.webhooks.adead(ep.id)
    view = app.webhooks.describe(dead)
    assert view["webhook_id"] == sent.webhook_id and view["endpoint"] == ep.id
    assert (view["event_type"], view["attempts"], view["state"]) == (
        "hooktest.order_paid",
        3,
        "dead",
    )
    assert view["error"].startswith("DeliveryFailed: HTTP 500") and view["occurred_at"].endswith(
        "Z"
    )
    with pytest.raises(ValueError, match="not a webhook delivery"):
        app.webhooks.describe(replace(dead, message=replace(dead.message, name="other.task")))

    await app.webhooks.aupdate_endpoint(ep.id, url=base + "/ok")  # the partner fixed it
    assert await app.webhooks.areplay(ep.id) == 1
    await drain(app)
    assert sent.webhook_id in {r.webhook_id for r in rec.on("/ok")}
    info = await app.broker.get(sent.job.id)
    assert info is not None and info.state == State.SUCCEEDED
    assert await app.webhooks.adead(ep.id) == []


async def test_a_receiver_that_does_not_answer_in_time_fails_the_attempt(
    make_app: Callable[..., dw.App], receiver: tuple[Receiver, str]
) -> None:
    _, base = receiver
    app = make_app(timeout=0.3, retry=dw.Retry.never())
    ep = await app.webhooks.aadd_endpoint(base + "/slow")
    sent = await app.webhooks.asend(ep, "hooktest.order_paid", {"order_id": "D", "cents": 3})
    await drain(app)
    info = await app.broker.get(sent.job.id)
    assert info is not None and info.state == State.DEAD
    assert "ReadTimeout" in info.message.errors[-1].message
    [a] = await app.webhooks.aattempts(ep.id, sent.webhook_id)
    assert a.outcome == "failed" and a.status is None and "ReadTimeout" in a.error


async def test_429_with_retry_after_waits_as_long_as_the_receiver_asked(
    app: dw.App, receiver: tuple[Receiver, str]
) -> None:
    rec, base = receiver
    ep = await app.webhooks.aadd_endpoint(base + "/throttle")
    sent = await app.webhooks.asend(ep, "hooktest.order_paid", {"order_id": "E", "cents": 4})
    await drain(app)
    first, second = rec.requests
    # the task's own backoff is 50 ms; the receiver asked for 1 s
    assert second.at - first.at >= 0.95
    assert first.webhook_id == second.webhook_id == sent.webhook_id
    log = await app.webhooks.aattempts(ep.id, sent.webhook_id)
    assert [(a.outcome, a.status) for a in log] == [("throttled", 429), ("delivered", 200)]


async def test_410_gone_disables_the_endpoint_and_dead_letters_what_is_queued(
    app: dw.App, receiver: tuple[Receiver, str]
) -> None:
    rec, base = receiver
    ep = await app.webhooks.aadd_endpoint(base + "/gone")
    a = await app.webhooks.asend(ep, "hooktest.order_paid", {"order_id": "F1", "cents": 5})
    b = await app.webhooks.asend(ep, "hooktest.order_paid", {"order_id": "F2", "cents": 5})
    await drain(app, concurrency=1)
    assert len(rec.requests) == 1  # the second was not sent: the endpoint was disabled
    disabled = await app.webhooks.aendpoint(ep.id)
    assert disabled.disabled and "410" in disabled.disabled_reason
    for sent, why in ((a, "410 Gone"), (b, "is disabled")):
        info = await app.broker.get(sent.job.id)
        assert info is not None and info.state == State.DEAD
        assert why in info.message.errors[-1].message
        assert info.message.attempt == 1
    with pytest.raises(EndpointDisabled):
        await app.webhooks.asend(ep, "hooktest.order_paid", {"order_id": "F3", "cents": 5})
    assert not (await app.webhooks.aenable(ep.id)).disabled


async def test_an_open_breaker_defers_deliveries_without_sending_or_using_attempts(
    make_app: Callable[..., dw.App], receiver: tuple[Receiver, str]
) -> None:
    rec, base = receiver
    app = make_app(
        retry=dw.Retry(attempts=2, backoff=0.05, jitter=0),
        breaker_threshold=2,
        breaker_cooldown=0.5,
    )
    ep = await app.webhooks.aadd_endpoint(base + "/fail")
    a = await app.webhooks.asend(ep, "hooktest.order_paid", {"order_id": "G1", "cents": 6})
    b = await app.webhooks.asend(ep, "hooktest.order_paid", {"order_id": "G2", "cents": 6})
    await drain(app, scheduled=False, concurrency=1)  # two failures: the breaker opens
    [health] = await app.webhooks.ahealth(ep.id)
    assert health["breaker"] == "open"
    # the probe is due a cool-down after the breaker opened
    assert health["breaker_probe_at"] == pytest.approx(health["breaker_opened_at"] + 0.5)
    await app.webhooks.aupdate_endpoint(ep.id, url=base + "/ok")  # the partner recovers
    await drain(app)
    assert len(rec.on("/fail")) == 2  # retries while open sent nothing
    assert {r.webhook_id for r in rec.on("/ok")} == {a.webhook_id, b.webhook_id}
    for sent in (a, b):
        log = await app.webhooks.aattempts(ep.id, sent.webhook_id)
        outcomes = [x.outcome for x in log]
        assert outcomes[0] == "failed" and outcomes[-1] == "delivered"
        assert "deferred" in outcomes
        # the last attempt is the 2nd of 2: the deferrals used none
        assert log[-1].attempt == 2
        done = await app.broker.get(log[-1].job_id)
        assert done is not None and done.state == State.SUCCEEDED
    [health] = await app.webhooks.ahealth(ep.id)
    assert health["breaker"] == "closed" and health["dead"] == 0


async def test_a_probe_answered_with_a_4xx_closes_the_breaker(
    make_app: Callable[..., dw.App], receiver: tuple[Receiver, str]
) -> None:
    """A partner that answers, even 429, is up: the deliveries waiting behind
    the probe go at once instead of waiting out the probe's timeout (60 s,
    longer than this drain may take)."""
    rec, base = receiver
    app = make_app(retry=dw.Retry.never(), breaker_threshold=2, breaker_cooldown=0.3)
    ep = await app.webhooks.aadd_endpoint(base + "/fail")
    for i in range(2):
        await app.webhooks.asend(ep, "hooktest.order_paid", {"order_id": f"P{i}", "cents": 1})
    await drain(app, concurrency=1)
    [health] = await app.webhooks.ahealth(ep.id)
    assert health["breaker"] == "open"
    await app.webhooks.aupdate_endpoint(ep.id, url=base + "/throttle")  # up, but 429
    later = [
        await app.webhooks.asend(ep, "hooktest.order_paid", {"order_id": f"Q{i}", "cents": 1})
        for i in range(2)
    ]
    await drain(app, concurrency=1, timeout=20)
    assert {r.webhook_id for r in rec.on("/throttle")} == {s.webhook_id for s in later}
    [health] = await app.webhooks.ahealth(ep.id)
    assert health["breaker"] == "closed" and health["consecutive_failures"] == 0


async def test_an_endpoints_concurrency_holds_across_the_workers_slots(
    app: dw.App, receiver: tuple[Receiver, str]
) -> None:
    rec, base = receiver
    ep = await app.webhooks.aadd_endpoint(base + "/hold", concurrency=2)
    for i in range(12):
        await app.webhooks.asend(ep, "hooktest.order_paid", {"order_id": f"H{i}", "cents": i})
    worker = await drain(app, concurrency=8)
    assert len({r.webhook_id for r in rec.requests}) == 12
    assert rec.max_inflight == 2
    assert worker.counts["throttled"] > 0  # held back without an attempt, as flow control does
    assert worker.counts["dead"] == 0


async def test_published_events_reach_the_enabled_endpoints_that_want_them_once(
    app: dw.App, receiver: tuple[Receiver, str]
) -> None:
    rec, base = receiver
    app.webhooks.forward(OrderPaid, OrderShipped)
    paid = await app.webhooks.aadd_endpoint(base + "/ok?p", event_types=["hooktest.order_paid"])
    every = await app.webhooks.aadd_endpoint(base + "/ok?all")
    shipped = await app.webhooks.aadd_endpoint(
        base + "/ok?s", event_types=["hooktest.order_shipped"]
    )
    off = await app.webhooks.aadd_endpoint(base + "/ok?off")
    await app.webhooks.adisable(off.id)
    event_id = await app.apublish(OrderPaid(order_id="J", cents=7))
    await drain(app)
    got = sorted((r.headers["webhook-id"], r.body) for r in rec.requests)
    assert len(got) == 2 and {g[0] for g in got} == {"msg_" + event_id.replace("-", "")}
    for ep in (paid, every):
        [a] = await app.webhooks.aattempts(ep.id, got[0][0])
        assert a.outcome == "delivered"
    assert await app.webhooks.aattempts(shipped.id, got[0][0]) == []
    # the fan-out run again (a redelivery, a forced replay) makes no second delivery
    assert await replay_events(app, "hooktest.order_paid", "webhooks", force=True) == 1
    await drain(app)
    assert len(rec.requests) == 2
    # ... while an endpoint added later catches up on the event the same way
    late = await app.webhooks.aadd_endpoint(base + "/ok?late")
    await replay_events(app, "hooktest.order_paid", "webhooks", force=True)
    await drain(app)
    assert len(rec.requests) == 3 and rec.requests[-1].webhook_id == got[0][0]
    verify(late.secret, rec.requests[-1].headers, rec.requests[-1].body)


async def test_a_rotated_secret_signs_beside_the_new_one_while_the_receiver_switches(
    app: dw.App, receiver: tuple[Receiver, str]
) -> None:
    rec, base = receiver
    ep = await app.webhooks.aadd_endpoint(base + "/ok")
    rotated = await app.webhooks.arotate_secret(ep.id, keep_old_for=3600)
    assert rotated.secret != ep.secret
    await app.webhooks.asend(ep, "hooktest.order_paid", {"o": 1})
    await drain(app)
    [req] = rec.requests
    assert len(req.headers["webhook-signature"].split()) == 2
    verify(ep.secret, req.headers, req.body)  # a receiver still on the old secret
    verify(rotated.secret, req.headers, req.body)  # one that switched


async def test_a_chosen_webhook_id_is_sent_once_per_endpoint(
    app: dw.App, receiver: tuple[Receiver, str]
) -> None:
    rec, base = receiver
    ep = await app.webhooks.aadd_endpoint(base + "/ok")
    one = await app.webhooks.asend(ep, "hooktest.order_paid", {"o": 1}, webhook_id="order-42")
    two = await app.webhooks.asend(ep, "hooktest.order_paid", {"o": 1}, webhook_id="order-42")
    assert one.job.id == two.job.id
    await drain(app)
    assert [r.webhook_id for r in rec.requests] == ["order-42"]


async def test_the_registry_is_shared_by_every_app_on_the_broker(
    make_app: Callable[..., dw.App], broker_url: str
) -> None:
    if broker_url.startswith("memory"):
        pytest.skip("a memory broker is one process")
    one, two = make_app(), make_app()
    ep = await one.webhooks.aadd_endpoint("https://hooks.example.com/in", rate_limit="5/s")
    [seen] = await two.webhooks.aendpoints()
    assert (seen.id, seen.secret, seen.rate_limit) == (ep.id, ep.secret, (5, 1.0))
    await two.webhooks.adisable(ep.id, "paused by support")
    with pytest.raises(EndpointDisabled, match="paused by support"):
        await one.webhooks.asend(ep.id, "hooktest.order_paid", {})
    assert await two.webhooks.aremove(ep.id)
    with pytest.raises(EndpointNotFound):
        await one.webhooks.asend(ep.id, "hooktest.order_paid", {})


def test_bad_input_is_named_at_the_call(broker_url: str) -> None:
    app = dw.App(broker_url)
    try:
        _bad_input(app)
    finally:
        app.close()


def _bad_input(app: dw.App) -> None:
    hooks = app.webhooks
    hooks.forward(OrderPaid)
    for url in ("ftp://example.com/x", "example.com/x", "http:///nohost"):
        with pytest.raises(dw.ConfigurationError, match="http:// or https://"):
            hooks.add_endpoint(url)
    with pytest.raises(dw.ConfigurationError, match="not forwarded"):
        hooks.add_endpoint("https://example.com/h", event_types=["hooktest.other"])
    with pytest.raises(dw.ConfigurationError, match="rate_limit"):
        hooks.add_endpoint("https://example.com/h", rate_limit="fast")
    with pytest.raises(dw.ConfigurationError, match="concurrency"):
        hooks.add_endpoint("https://example.com/h", concurrency=0)
    with pytest.raises(dw.ConfigurationError, match="bytes"):
        hooks.add_endpoint("https://example.com/h", secret="whsec_c2hvcnQ=")
    ep = hooks.add_endpoint("https://example.com/h", id="partner-1")
    with pytest.raises(dw.ConfigurationError, match="already registered"):
        hooks.add_endpoint("https://example.com/h", id="partner-1")
    with pytest.raises(EndpointNotFound):
        hooks.send("nobody", "hooktest.order_paid", {})
    with pytest.raises(dw.SerializationError):
        hooks.send(ep, "hooktest.order_paid", {"at": object()})
    with pytest.raises(dw.ConfigurationError, match="webhook_id"):
        hooks.send(ep, "hooktest.order_paid", {}, webhook_id="has.dot")
    with pytest.raises(dw.ConfigurationError, match="positive"):
        hooks.configure(timeout=0)
