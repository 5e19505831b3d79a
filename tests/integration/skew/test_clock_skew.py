"""Clock skew: a host whose wall clock is 2 s or 30 s ahead or behind.

Leases, the scheduler's lock and run times are written by one host and
compared by another.  Each test pairs a host on the true clock with one whose
wall clock is shifted (libfaketime; its monotonic clock, which NTP does not
step, is left alone) and checks what a user relies on:

* a skewed host neither steals a live lease (as a rescuer ahead would) nor
  writes one that is over before it starts (as a worker behind would);
* the lease of a skewed host that dies comes back within the lease and
  ``SLACK`` (a worker ahead must not make it linger);
* the same for the scheduler's lock (``acquire``/``renew``);
* a delay set by a skewed host (an ``eta``, a retry's wait) still means
  that many seconds.

The bound docs/guarantees.md states ("Clock skew") is what ``SLACK``
allows.  The brokers are those that serve several hosts (``multi_host``):
SQLite and the memory store are one machine's, whose processes share one
clock.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.brokers import BROKERS
from tests.integration.skew.agent import Host
from tests.waiting import wait_until

pytestmark = pytest.mark.crash

#: the brokers that serve several hosts
HOSTED = ["redis", "postgres", "nats", "rabbitmq+redis", "rabbitmq+postgres"]
#: a lease shorter than the smallest skew, so a broker that compares hosts'
#: wall clocks shows it at once (a lease over before it starts, a live one
#: taken, an expired one kept past the lease and the skew)
LEASE = 1.5
#: how long a job that must be there may take to show (a RabbitMQ copy
#: travels while its record is written)
WAIT = 5.0
#: how late past its end an expired lease (or lock) may come back, and how
#: far a delay may be off: polling and round trips, never the skew
SLACK = 1.0


@pytest.fixture
def hosts(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[Host, Host]]:
    broker, offset = request.param
    url = BROKERS[broker](tmp_path)
    true = Host(url, "true-host")
    try:
        skewed = Host(url, "skewed-host", offset=offset)
    except BaseException:
        true.close()
        raise
    try:
        drift = skewed.call("time")["time"] - true.call("time")["time"]
        assert abs(drift - offset) < 1.0, f"the skewed host's clock is off by {drift}, not {offset}"
        yield true, skewed
    finally:
        skewed.close()
        true.close()


def _cases(ahead: float, behind: float) -> list[Any]:
    """Every broker with one skew ahead and one behind: small (an NTP daemon
    that has not converged) or large (none).  Each test takes a
    different pair, so the four skews are each run against every broker and
    each property, without the whole product (it ran past the suite's time
    budget)."""
    return [pytest.param((b, o), id=f"{b}-{o:+g}s") for b in HOSTED for o in (ahead, behind)]


def _take(host: Host, lease: float) -> list[str]:
    """Fetch a job that must be there.  ``fetch`` without waiting (a waiting
    RabbitMQ fetch leaves a consumer that keeps taking copies into this
    host's buffer, out of the other's reach)."""
    got: list[str] = []

    def took() -> bool:
        got.extend(host.call("fetch", lease=lease)["ids"])
        return bool(got)

    wait_until(took, "a job to fetch", timeout=WAIT)
    return got


def _running_by(host: Host, id: str, worker: str) -> bool:
    st = host.call("state", id=id)
    return bool(st["state"] == "running" and st["worker"] == worker)


@pytest.mark.parametrize("hosts", _cases(2.0, -30.0), indirect=True)
def test_leases_hold_and_end_on_time_between_skewed_hosts(hosts: tuple[Host, Host]) -> None:
    true, skewed = hosts
    [mine, theirs] = true.call("enqueue", n=2)["ids"]
    # the skewed host works on one job: its lease is live for the others
    [got] = _take(skewed, LEASE)
    other = theirs if got == mine else mine
    assert true.call("rescue")["n"] == 0
    assert _running_by(true, got, "skewed-host")
    # the true host works on the other: the skewed host does not take it
    assert _take(true, LEASE) == [other]
    assert skewed.call("rescue")["n"] == 0
    assert true.call("extend", lease=LEASE)["lost"] == []
    assert skewed.call("extend", lease=LEASE)["lost"] == []
    true.call("ack")
    # the skewed host dies: its job comes back within the lease and SLACK
    skewed.kill()

    def back() -> bool:
        true.call("rescue")
        return not _running_by(true, got, "skewed-host")

    wait_until(back, "the dead skewed host's lease to end", timeout=LEASE + SLACK)
    assert _take(true, 30.0) == [got]


@pytest.mark.parametrize("hosts", _cases(30.0, -2.0), indirect=True)
def test_the_scheduler_lock_holds_and_ends_on_time_between_skewed_hosts(
    hosts: tuple[Host, Host],
) -> None:
    true, skewed = hosts
    name = "dumbwaiter:scheduler"
    token = true.call("acquire", name=name, owner="true-host", ttl=LEASE)["token"]
    assert token is not None
    assert skewed.call("acquire", name=name, owner="skewed-host", ttl=LEASE)["token"] is None
    assert true.call("renew", name=name, owner="true-host", token=token, ttl=LEASE)["ok"]
    # the true host stops renewing: the skewed one takes over on time
    wait_until(
        lambda: skewed.call("acquire", name=name, owner="skewed-host", ttl=LEASE)["token"],
        "the skewed host to take the lock after it ran out",
        timeout=LEASE + SLACK,
    )
    held = skewed.call("acquire", name=name, owner="skewed-host", ttl=LEASE)["token"]
    assert held is not None and held > token  # a newer fencing token
    assert true.call("acquire", name=name, owner="true-host", ttl=LEASE)["token"] is None
    assert skewed.call("renew", name=name, owner="skewed-host", token=held, ttl=LEASE)["ok"]
    assert not true.call("renew", name=name, owner="true-host", token=token, ttl=LEASE)["ok"]
    skewed.kill()
    wait_until(
        lambda: true.call("acquire", name=name, owner="true-host", ttl=LEASE)["token"],
        "the true host to take the lock after the skewed holder died",
        timeout=LEASE + SLACK,
    )


@pytest.mark.parametrize("hosts", _cases(30.0, -30.0), indirect=True)
def test_a_delay_set_by_a_skewed_host_is_that_many_seconds(hosts: tuple[Host, Host]) -> None:
    true, skewed = hosts
    delay = 2 * SLACK
    # an eta set by the skewed host
    [job] = skewed.call("enqueue", delay=delay)["ids"]
    assert true.call("fetch", lease=30.0)["ids"] == []
    wait_until(
        lambda: true.call("fetch", lease=30.0)["ids"], "the delayed job", timeout=delay + SLACK
    )
    true.call("ack")
    # a retry's wait set by the skewed host
    [again] = true.call("enqueue")["ids"]
    assert _take(skewed, 30.0) == [again]
    skewed.call("retry", delay=delay)
    assert true.call("fetch", lease=30.0)["ids"] == []
    wait_until(
        lambda: true.call("fetch", lease=30.0)["ids"], "the retried job", timeout=delay + SLACK
    )
    assert job != again
