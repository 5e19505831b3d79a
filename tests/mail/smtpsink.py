"""A real SMTP server for the tests: aiosmtpd on a loopback port, in a thread.

``Sink`` is its handler: it records every message the server received
(``attempts``) and those it accepted with a 250 (``accepted``), and answers
by script: ``rcpt_replies`` refuses chosen recipients (``"550 5.1.1 ..."``),
``data_replies`` answers the next DATA commands in turn (``"451 4.7.1 ..."``)
before going back to 250.  While the file ``hold`` exists, DATA holds after
recording the message and before answering: the sending worker is then
mid-delivery (the server has the message, the client waits for its 250),
which is where the crash test kills it.
"""

from __future__ import annotations

import asyncio
import email
import email.policy
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from email.message import EmailMessage
from pathlib import Path
from typing import Any

from aiosmtpd.smtp import SMTP


@dataclass
class Received:
    mail_from: str
    rcpt_tos: list[str]
    message: EmailMessage
    raw: bytes

    @property
    def message_id(self) -> str:
        return str(self.message["Message-ID"])


class Sink:
    def __init__(self, hold: Path | None = None) -> None:
        self.attempts: list[Received] = []
        self.accepted: list[Received] = []
        #: Message-IDs of the messages held in DATA (received, not yet answered)
        self.held: list[str] = []
        self.rcpt_replies: dict[str, str] = {}
        self.data_replies: list[str] = []
        self.hold = hold
        self.lock = threading.Lock()

    async def handle_RCPT(
        self, server: Any, session: Any, envelope: Any, address: str, rcpt_options: list[str]
    ) -> str:
        reply = self.rcpt_replies.get(address)
        if reply is not None:
            return reply
        envelope.rcpt_tos.append(address)
        return "250 OK"

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
        raw = bytes(envelope.content)
        msg = email.message_from_bytes(raw, _class=EmailMessage, policy=email.policy.default)
        rec = Received(envelope.mail_from, list(envelope.rcpt_tos), msg, raw)
        holding = self._holding()
        with self.lock:
            self.attempts.append(rec)
            reply = self.data_replies.pop(0) if self.data_replies else "250 2.0.0 OK queued"
            if reply.startswith("250"):
                self.accepted.append(rec)
            if holding:
                self.held.append(rec.message_id)
        while self._holding():  # noqa: ASYNC110 - the test's file; it kills the client meanwhile
            await asyncio.sleep(0.02)
        return reply

    def _holding(self) -> bool:
        return self.hold is not None and self.hold.exists()


@contextmanager
def smtp_server(handler: Sink) -> Iterator[int]:
    """Serve ``handler`` on 127.0.0.1 (a free port) in a thread; yield the port."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)
    port = int(sock.getsockname()[1])
    loop = asyncio.new_event_loop()
    ready = threading.Event()
    failed: list[BaseException] = []

    def run() -> None:
        asyncio.set_event_loop(loop)
        try:
            server = loop.run_until_complete(
                loop.create_server(
                    lambda: SMTP(handler, hostname="sink.test", loop=loop), sock=sock
                )
            )
        except BaseException as exc:  # pragma: no cover - reported below
            failed.append(exc)
            ready.set()
            return
        ready.set()
        loop.run_forever()
        server.close()
        loop.run_until_complete(server.wait_closed())
        pending = asyncio.all_tasks(loop)
        for t in pending:
            t.cancel()
        loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
        loop.close()

    thread = threading.Thread(target=run, daemon=True, name="smtp-sink")
    thread.start()
    ready.wait(10)
    if failed:
        raise failed[0]
    try:
        yield port
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=10)
        sock.close()
