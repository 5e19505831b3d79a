"""The broker's private hooks stay on its own client: a user's nats-py client
in the same process, made after an App on nats:// has enqueued and fetched
(both hooks used), has nats-py's own parser and works as without dumbwaiter
(brokers/hooks.py, docs/benchmarks.md "Private hooks").

The check runs in a fresh interpreter, so it sees nats-py as it was before
dumbwaiter was imported at all."""

from __future__ import annotations

import asyncio
import os

import pytest

from dumbwaiter.brokers import hooks
from dumbwaiter.brokers.nats.protocol import (
    header,
    headers,
)
from dumbwaiter.brokers.nats.wire import Wire
from tests.conftest import require_service
from tests.integration.nats.server import SERVER, _check
from tests.integration.untouched import run_fresh

SCRIPT = r"""
import asyncio
import sys

import nats
import nats.aio.client
import nats.aio.subscription
import nats.protocol.parser


OWNERS = {
        "nats": nats,
        "nats.aio.client": nats.aio.client,
        "nats.protocol.parser": nats.protocol.parser,
        "Client": nats.aio.client.Client,
        "Parser": nats.protocol.parser.Parser,
        "Subscription": nats.aio.subscription.Subscription,
    }


before = snapshot(OWNERS)


async def own_client(server, subject):
    nc = await nats.connect(server)
    try:
        assert type(nc._ps) is nats.protocol.parser.Parser
        assert [n for n in vars(nc) if callable(getattr(type(nc), n, None))] == []
        got = asyncio.get_running_loop().create_future()

        async def on_msg(msg):
            got.set_result((msg.subject, msg.data, msg.headers))

        await nc.subscribe(subject + ".events", cb=on_msg)

        async def responder(msg):
            await msg.respond(msg.data.upper())

        await nc.subscribe(subject + ".service", cb=responder)
        await nc.publish(subject + ".events", b"mine", headers={"K": "v"})
        assert await asyncio.wait_for(got, 30) == (subject + ".events", b"mine", {"K": "v"})
        reply = await nc.request(subject + ".service", b"ping", timeout=30)
        assert reply.data == b"PING"
    finally:
        await nc.close()


async def main(url, server, subject):
    app = await one_job(url)
    link = app.broker._links.current()
    assert link is not None
    wire = link.wire
    assert wire.parser_hook and wire.send_hook  # the hooks were on
    touched = changed(before, snapshot(OWNERS))
    assert touched == [], touched
    await own_client(server, subject)
    await app.aclose()
    print("ok")


asyncio.run(main(*sys.argv[1:4]))
"""


def test_a_users_own_client_is_nats_pys_beside_the_broker(shared_url: str) -> None:
    run_fresh(SCRIPT, shared_url, SERVER, f"dwiso{os.getpid()}")


async def _seen_through(
    monkeypatch: pytest.MonkeyPatch, off: str, subject: str
) -> tuple[bool, list[tuple[bytes, bytes, bytes | None, bytes]], int]:
    """What a handler gets for a publish with headers and one without, with
    ``DUMBWAITER_HOOKS_OFF=off``; and the status of a request nobody answers."""
    monkeypatch.setenv(hooks.ENV, off)
    wire = Wire([SERVER], {}, timeout=10.0)
    await wire.connect(10.0)
    try:
        got: list[tuple[bytes, bytes, bytes | None, bytes]] = []
        done = asyncio.Event()

        def on_msg(s: bytes, r: bytes, h: bytes | None, d: bytes) -> None:
            got.append((s, r, h, d))
            if len(got) == 2:
                done.set()

        await wire.subscribe(subject + ".*", on_msg)
        hdr = headers((b"Dw-Id", b"x1"), (b"Nats-Msg-Id", "m-1"))
        wire.publish(subject.encode() + b".a", b"with headers", hdr, reply=b"back.here")
        wire.publish(subject.encode() + b".b", b"")
        await wire.flush()
        await asyncio.wait_for(done.wait(), 10)
        nobody = await wire.call(subject.encode() + b"-nobody", b"?")
        return wire.parser_hook and wire.send_hook, got, nobody.status
    finally:
        await wire.close()


async def test_the_public_path_hands_handlers_what_the_hooks_do(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Hooks off (``DUMBWAITER_HOOKS_OFF=1``), nats-py's public subscribe
    callbacks and publish carry the same subject, reply, header block and
    payload to a handler, and the server's inline status (503: no
    responders) still reads as ``Reply.status``."""
    require_service("NATS", *_check())
    subject = f"dwisowire{os.getpid()}"
    hooked, with_hooks, status = await _seen_through(monkeypatch, "", subject)
    public, without, public_status = await _seen_through(monkeypatch, "1", subject)
    assert hooked and not public
    assert with_hooks == without
    assert with_hooks[0][:2] == (subject.encode() + b".a", b"back.here")
    assert header(with_hooks[0][2], b"Dw-Id") == b"x1"
    assert with_hooks[1] == (subject.encode() + b".b", b"", None, b"")
    assert status == public_status == 503
