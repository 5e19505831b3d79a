"""The SSRF guard refuses internal targets, checking the resolved addresses.

Nothing here sends a packet to a non-loopback address: a refused address is
refused before any connection, and the one delivery that connects goes to
the test's own receiver on 127.0.0.1, with loopback allowed explicitly."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

import dumbwaiter as dw
from dumbwaiter.state import State
from dumbwaiter.testing import drain
from dumbwaiter.webhooks import AddressPolicy, UnsafeTarget
from dumbwaiter.webhooks.ssrf import checked_addresses
from tests.brokers import BROKERS

from .receiver import Receiver

REFUSED = {
    "127.0.0.1": "loopback",
    "10.11.12.13": "private",
    "192.168.1.20": "private",
    "172.16.5.4": "private",
    "169.254.169.254": "link-local",
    "::1": "loopback",
    "fe80::1": "link-local",
    "224.0.0.251": "multicast",
    "240.0.0.1": "reserved",
    "0.0.0.0": "unspecified",
    "::ffff:127.0.0.1": "loopback",
    "100.64.0.1": "non-public",
}


@pytest.mark.parametrize("address", sorted(REFUSED))
def test_internal_addresses_are_refused_by_default(address: str) -> None:
    why = AddressPolicy.make().refused(address)
    assert why is not None and REFUSED[address] in why


def test_public_addresses_pass_and_settings_allow_private_ones() -> None:
    assert AddressPolicy.make().refused("93.184.215.14") is None
    assert AddressPolicy.make().refused("2606:4700::1111") is None
    assert AddressPolicy.make(allow_private=True).refused("10.0.0.1") is None
    allow = AddressPolicy.make(allow=["10.20.0.0/16", "127.0.0.1"])
    assert allow.refused("10.20.3.4") is None and allow.refused("127.0.0.1") is None
    assert allow.refused("10.21.0.1") is not None
    with pytest.raises(dw.ConfigurationError, match="not an IP address or network"):
        AddressPolicy.make(allow=["intranet.example"])


async def test_a_host_name_is_judged_by_every_address_it_resolves_to() -> None:
    with pytest.raises(UnsafeTarget, match="loopback"):
        await checked_addresses("localhost", 80, AddressPolicy.make())
    assert "127.0.0.1" in await checked_addresses(
        "localhost", 80, AddressPolicy.make(allow_private=True)
    )


@pytest.fixture
def broker_url(tmp_path: Path) -> str:
    return BROKERS["memory"](tmp_path)


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:{port}/ok",
        "http://localhost:{port}/ok",
        "http://[::1]:{port}/ok",
        "http://10.11.12.13/ok",
        "http://169.254.169.254/latest/meta-data/",
    ],
)
async def test_deliveries_to_internal_targets_are_dead_lettered_unsent(
    make_app: Callable[..., dw.App], receiver: tuple[Receiver, str], url: str
) -> None:
    rec, base = receiver
    port = base.rsplit(":", 1)[1]
    app = make_app(allow_private=False)
    ep = await app.webhooks.aadd_endpoint(url.format(port=port))
    sent = await app.webhooks.asend(ep, "order.paid", {"id": 1})
    await drain(app)
    info = await app.broker.get(sent.job.id)
    assert info is not None and info.state == State.DEAD
    assert "refused to connect" in info.message.errors[-1].message
    assert info.message.attempt == 1  # not retried: the address will not change its kind
    [attempt] = await app.webhooks.aattempts(ep.id, sent.webhook_id)
    assert attempt.outcome == "refused" and attempt.status is None
    assert rec.requests == []  # nothing reached the receiver on loopback


async def test_the_same_delivery_reaches_loopback_when_allowed(
    make_app: Callable[..., dw.App], receiver: tuple[Receiver, str]
) -> None:
    rec, base = receiver
    app = make_app(allow_private=True)
    ep = await app.webhooks.aadd_endpoint(base.replace("127.0.0.1", "localhost") + "/ok")
    sent = await app.webhooks.asend(ep, "order.paid", {"id": 1})
    await drain(app)
    assert [r.webhook_id for r in rec.requests] == [sent.webhook_id]
