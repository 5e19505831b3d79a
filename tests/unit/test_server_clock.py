"""brokers/clock.py: the server's time as a host reads it."""

from __future__ import annotations

import time

import pytest

from dumbwaiter.brokers import clock as clock_module
from dumbwaiter.brokers.clock import TOLERANCE, ServerClock


def _read(clock: ServerClock, ahead: float, rtt: float = 0.002) -> None:
    """A read that found the server ``ahead`` seconds ahead of this host."""
    sent = time.monotonic()
    clock.observe(time.time() + ahead, sent - rtt / 2, sent + rtt / 2)


def test_a_host_behind_the_server_stamps_the_servers_time() -> None:
    clock = ServerClock()
    assert clock.offset() == 0.0  # never read: this host's clock
    _read(clock, 30.0)
    assert not clock.due
    assert clock.offset() == pytest.approx(30.0, abs=0.05)
    assert clock.now() - time.time() == pytest.approx(30.0, abs=0.05)
    # an eta this host computed as "in 10 s" is in 10 s on the server
    assert clock.to_server(time.time() + 10) - clock.now() == pytest.approx(10.0, abs=0.05)


def test_a_host_ahead_of_the_server_too() -> None:
    clock = ServerClock()
    _read(clock, -2.0)
    assert clock.offset() == pytest.approx(-2.0, abs=0.05)


def test_a_host_in_sync_keeps_its_own_times_exactly() -> None:
    clock = ServerClock()
    _read(clock, TOLERANCE / 2)
    assert clock.offset() == 0.0
    t = time.time() + 3600
    assert clock.to_server(t) == t


def test_a_difference_within_the_reads_round_trip_is_left_alone() -> None:
    clock = ServerClock()
    _read(clock, 0.4, rtt=1.0)  # a slow read cannot tell 0.4 s from its error
    assert clock.offset() == 0.0


async def test_sync_reads_when_due_only() -> None:
    clock = ServerClock(every=60.0)
    reads = 0

    async def read() -> float:
        nonlocal reads
        reads += 1
        return time.time() + 5.0

    await clock.sync(read)
    await clock.sync(read)
    assert reads == 1 and clock.offset() == pytest.approx(5.0, abs=0.05)


async def test_a_failed_read_keeps_the_last_reading_and_is_tried_again_later(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # an hour: "not at once" must not depend on how fast a loaded machine
    # gets from the failed read to the check (a full CI run once took 1 s)
    monkeypatch.setattr(clock_module, "RETRY_AFTER", 3600.0)
    clock = ServerClock(every=0.0)
    _read(clock, 30.0)

    async def down() -> float:
        raise ConnectionError("the server is failing over")

    await clock.try_sync(down)  # does not raise
    assert clock.offset() == pytest.approx(30.0, abs=0.05)
    assert not clock.due  # not read again at once
