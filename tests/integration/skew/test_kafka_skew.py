"""Clock skew on Kafka: its records' times are the state store's.

Kafka has no clock of its own to lean on, so a lease, a job's run time and
a delay tier's due time are written on the state store's clock
(``brokers/clock.py``).  The shared skew tests (``test_clock_skew.py``) let
both hosts fetch from one queue, which on Kafka is decided by which host
holds which partition, not by the clock; here only the true host fetches,
and the skewed host writes what the true host then judges:

* an ``eta`` set by a host 30 s ahead or behind still means that many
  seconds (ahead, the job would wait 30 s more; behind, run at once);
* a rescuer 30 s ahead does not take a live lease (it would see it over).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.brokers import BROKERS
from tests.integration.skew.agent import Host
from tests.integration.skew.test_clock_skew import LEASE, SLACK
from tests.waiting import wait_until

pytestmark = pytest.mark.crash


@pytest.fixture(params=[30.0, -30.0], ids=["+30s", "-30s"])
def hosts(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[Host, Host]]:
    url = BROKERS["kafka"](tmp_path)
    true = Host(url, "true-host")
    try:
        skewed = Host(url, "skewed-host", offset=request.param)
    except BaseException:
        true.close()
        raise
    try:
        yield true, skewed
    finally:
        skewed.close()
        true.close()


def test_a_skewed_hosts_eta_and_rescue_follow_the_state_stores_clock(
    hosts: tuple[Host, Host],
) -> None:
    true, skewed = hosts
    delay = 2 * SLACK
    [job] = skewed.call("enqueue", delay=delay)["ids"]
    assert true.call("fetch", lease=LEASE)["ids"] == []
    wait_until(
        lambda: true.call("fetch", lease=LEASE)["ids"], "the delayed job", timeout=delay + SLACK
    )
    # the true host holds it: the skewed host's rescue leaves the lease alone
    assert skewed.call("rescue")["n"] == 0
    assert true.call("extend", lease=LEASE)["lost"] == []
    assert true.call("state", id=job)["worker"] == "true-host"
    true.call("ack")
