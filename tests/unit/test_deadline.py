"""The producer's deadline (brokers/deadline.py): what a broker's retry loop
reads in a producer call, and what it reads everywhere else.

A producer call (``enqueue``, ``publish``...) must answer within its
deadline; a worker's own calls keep the broker's ``reconnect`` window.  The
deadline travels with the call, through the App's portal thread for sync
callers on brokers without a sync path, and never into the tasks a broker
starts to outlive the call (a shared connect, a connection's reader).
"""

from __future__ import annotations

import asyncio
import time

import pytest

import dumbwaiter as dw
from dumbwaiter.brokers import deadline
from dumbwaiter.portal import Portal


def test_outside_a_producer_call_retries_follow_the_broker_window() -> None:
    assert deadline.current() is None
    assert deadline.retry_until(600.0) > time.monotonic() + 500
    assert deadline.remaining(10.0) == 10.0


def test_a_producer_call_bounds_retries_and_each_wait() -> None:
    token = deadline.start(2.0)
    try:
        until = deadline.current()
        assert until is not None and until <= time.monotonic() + 2.0
        assert deadline.retry_until(600.0) == until
        assert deadline.remaining(10.0) <= 2.0
        assert deadline.remaining(0.5) == 0.5  # a wait's own bound still holds
    finally:
        deadline.end(token)
    assert deadline.current() is None


def test_a_call_inside_another_keeps_the_earlier_deadline() -> None:
    outer = deadline.start(1.0)
    try:
        first = deadline.current()
        inner = deadline.start(60.0)
        try:
            assert deadline.current() == first
        finally:
            deadline.end(inner)
        assert deadline.current() == first
    finally:
        deadline.end(outer)


def test_backoff_stops_at_the_deadline_and_counts_from_the_call() -> None:
    token = deadline.start(0.2)
    try:
        backoff = deadline.Backoff(600.0)
        pauses = []
        while (pause := backoff.pause()) is not None:
            pauses.append(pause)
            time.sleep(pause)
        assert pauses, "the first failure gets a try again"
        assert time.monotonic() >= backoff.until
        assert backoff.waited >= 0.2
    finally:
        deadline.end(token)


def test_the_portal_carries_the_callers_deadline() -> None:
    """A sync enqueue on NATS or RabbitMQ runs the broker call on the App's
    portal thread: its retries must see the caller's deadline there."""

    async def seen() -> float | None:
        return deadline.current()

    portal = Portal()
    try:
        assert portal.call(seen()) is None
        token = deadline.start(3.0)
        try:
            assert portal.call(seen()) == deadline.current()
        finally:
            deadline.end(token)
    finally:
        portal.close()


async def test_a_detached_task_has_no_producer_deadline() -> None:
    """A connect shared by every caller of a loop must not give up when the
    first caller's deadline passes: the tasks that outlive a call run
    without one."""

    async def seen() -> float | None:
        return deadline.current()

    token = deadline.start(3.0)
    try:
        assert await asyncio.create_task(seen()) is not None  # a task of the call
        assert await deadline.detached(asyncio.get_running_loop(), seen()) is None
    finally:
        deadline.end(token)


def test_enqueue_timeout_is_checked_where_it_is_given() -> None:
    with pytest.raises(dw.ConfigurationError):
        dw.App("memory://deadline-check", enqueue_timeout=0)
    app = dw.App("memory://deadline-check")
    assert app.enqueue_timeout == 5.0

    @app.task
    def f() -> None: ...

    with pytest.raises(dw.ConfigurationError, match="enqueue_timeout"):
        f.options(enqueue_timeout=-1)
    assert dw.App("memory://deadline-check", enqueue_timeout=None).enqueue_timeout is None


def test_broker_errors_are_exported_and_ordered() -> None:
    """``except dw.BrokerError`` catches every broker failure; the
    subclasses say whether trying again can help."""
    assert issubclass(dw.BrokerUnavailable, dw.BrokerError)
    assert issubclass(dw.BrokerUnavailable, ConnectionError)
    assert issubclass(dw.BrokerConfigError, dw.BrokerError)
    assert issubclass(dw.BrokerAuthError, dw.BrokerConfigError)
    assert not issubclass(dw.BrokerConfigError, dw.BrokerUnavailable)
