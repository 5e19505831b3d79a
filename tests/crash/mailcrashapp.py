"""The app the mail crash test's worker processes import
(``tests.crash.mailcrashapp:app``): a mailer sending through SMTP to the test's
server on ``127.0.0.1:$DW_MAIL_SMTP_PORT``.

A middleware logs each attempt as it starts (``DW_CRASH_LOG``: ``job pid
attempt``) and ends (``DW_CRASH_DONE``: ``job pid status``).  While the file
``DW_CRASH_HOLD_AFTER`` exists, a job whose mail was sent (and recorded as
sent) holds before its ack and says so in ``DW_CRASH_HELD`` (``job pid
message-id``): the test kills the worker there, between the send and the ack.
Holding mid-delivery is the SMTP server's part (``tests.mail.smtpsink``).
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

import dumbwaiter as dw
from dumbwaiter.mail import SMTP, Mailer

LOG = os.environ.get("DW_CRASH_LOG", os.devnull)
DONE = os.environ.get("DW_CRASH_DONE", os.devnull)
HELD = os.environ.get("DW_CRASH_HELD", os.devnull)
HOLD_AFTER = os.environ.get("DW_CRASH_HOLD_AFTER", "")


def _append(path: str, line: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


def _holding() -> bool:
    return bool(HOLD_AFTER) and os.path.exists(HOLD_AFTER)


class Trace(dw.Middleware):
    async def around_process(self, ctx: dw.Context, call_next: Any) -> Any:
        _append(LOG, f"{ctx.job_id} {os.getpid()} {ctx.attempt}\n")
        outcome = await call_next()
        if outcome.get("status") == "sent" and _holding():
            _append(HELD, f"{ctx.job_id} {os.getpid()} {outcome['message_id']}\n")
            while _holding():  # noqa: ASYNC110 - the test's file; it kills us meanwhile
                await asyncio.sleep(0.02)
        _append(DONE, f"{ctx.job_id} {os.getpid()} {outcome.get('status')}\n")
        return outcome


app = dw.App(os.environ.get("DW_CRASH_URL", "memory://"), middleware=[Trace()])
mailer = Mailer(
    app,
    SMTP("127.0.0.1", int(os.environ.get("DW_MAIL_SMTP_PORT", "25")), timeout=60),
    sender="Shop <shop@example.com>",
    retry=dw.Retry(attempts=20, backoff=0.2, jitter=0),
)
