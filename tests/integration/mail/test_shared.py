"""The suppression list and the record of sent mail live in the broker, so
every process of an app sees the same ones: here, two apps on one broker
URL (a web process and a worker), on every broker several processes share."""

from __future__ import annotations

from pathlib import Path

import pytest

import dumbwaiter as dw
from dumbwaiter.mail import Mailer, Memory
from dumbwaiter.testing import drain
from tests.brokers import BROKERS, CROSS_PROCESS


@pytest.mark.parametrize("broker", CROSS_PROCESS)
async def test_one_list_and_one_record_for_every_process(broker: str, tmp_path: Path) -> None:
    url = BROKERS[broker](tmp_path)
    web, worker = dw.App(url), dw.App(url)
    try:
        on_web = Mailer(web, Memory(), sender="shop@example.com")
        outbox = Memory()
        on_worker = Mailer(worker, outbox, sender="shop@example.com")

        await on_web.asuppress("Gone@Example.com", "hard bounce")
        assert await on_worker.ais_suppressed("gone@example.com")
        assert [(s.address, s.reason) for s in await on_worker.asuppressed()] == [
            ("gone@example.com", "hard bounce")
        ]
        skipped = await on_web.asend(to="gone@example.com", subject="Hi", text="x")
        first = await on_web.asend(
            to="ann@example.com", subject="Hi", text="x", message_id="<m-1@x>"
        )
        await drain(worker, ["mail"])
        again = await on_web.asend(
            to="ann@example.com", subject="Hi", text="x", message_id="<m-1@x>"
        )
        await drain(worker, ["mail"])

        assert [e.message_id for e in outbox.outbox] == ["<m-1@x>"]
        assert (await skipped.aresult(timeout=10))["status"] == "suppressed"
        assert (await first.aresult(timeout=10))["status"] == "sent"
        assert (await again.aresult(timeout=10))["status"] == "already_sent"
        assert await on_worker.aunsuppress("gone@example.com")
        assert not await on_web.ais_suppressed("gone@example.com")
    finally:
        await web.aclose()
        await worker.aclose()
